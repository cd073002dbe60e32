"""Plugin isolation: fake distributions that collide, claim reserved names, raise, exit, sleep or
return garbage are reported (a RuntimeWarning, a BROKEN row of ``kermac info``) and skipped; kermac
and the other plugins keep working.  Each fake distribution is a ``*.dist-info`` directory with an
``entry_points.txt``, on ``sys.path`` in front of the real installation or behind it."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest
import torch

import kermac
from kermac import discovery, presets, registry, testing
from kermac.cli import main

HEADER = """
import dataclasses, os, sys, time
import torch
from kermac.backend import Availability, Backend
from kermac.hookspecs import hookimpl
from kermac.reference.backend import ReferenceBackend


class Correct(ReferenceBackend):
    '''Right answers (the reference's), ahead of the reference in auto.'''
    name = "correct"
    priority = 50
"""

#: Returns 123 for every distance: what a hijacked reference backend would compute.
EVIL_TORCH = """
class Evil(Correct):
    name = "torch"
    priority = 0

    def pairwise(self, problem):
        problem.out.fill_(123.0)


@hookimpl
def kermac_backends():
    return [Evil()]
"""


OK = """
class Ok(Correct):
    name = "ok"
"""


def backend_plugin(*names: str) -> str:
    """A plugin providing correct backends called ``names``."""
    classes = "".join(f"\nclass B{i}(Correct):\n    name = {n!r}\n" for i, n in enumerate(names))
    made = ", ".join(f"B{i}()" for i in range(len(names)))
    return classes + f"\n@hookimpl\ndef kermac_backends():\n    return [{made}]\n"


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``install(dist, {entry point: plugin source}, front=True)``: a fake distribution on sys.path.

    Plugin modules get unique names (no test sees another's); ``front=False`` puts the
    distribution behind the real installation on sys.path (discovered after kermac's own).
    """
    monkeypatch.delenv("KERMAC_BACKEND", raising=False)
    monkeypatch.delenv(discovery.ENV_LOAD_TIMEOUT, raising=False)
    modules: list[str] = []

    def install_dist(dist: str, plugins: dict[str, str], *, front: bool = True) -> Path:
        root = tmp_path / f"site-{len(list(tmp_path.iterdir()))}"
        info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir(parents=True)
        lines = []
        for ep_name, source in plugins.items():
            module = f"kermac_fake_{uuid.uuid4().hex[:12]}"
            (root / f"{module}.py").write_text(textwrap.dedent(HEADER) + textwrap.dedent(source))
            lines.append(f"{ep_name} = {module}\n")
            modules.append(module)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[kermac.backends]\n" + "".join(lines))
        if front:
            monkeypatch.syspath_prepend(str(root))
        else:
            monkeypatch.setattr(sys, "path", [*sys.path, str(root)])
            importlib.invalidate_caches()
        return info

    yield install_dist
    registry.reset()
    for module in modules:
        sys.modules.pop(module, None)


def discover() -> tuple[dict[str, registry.BackendStatus], list[str]]:
    """Rediscover the installed plugins: the rows of kermac.backends() by name, and the warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        registry.reset()
        rows = kermac.backends()
    names = [r.name for r in rows]
    assert len(names) == len(set(names)), f"two rows share a name: {names}"
    return {r.name: r for r in rows}, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def assert_reference_runs_torch() -> None:
    """``torch`` is kermac's reference backend, and right."""
    x, z = torch.randn(5, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    assert type(registry.get_backend("torch")).__module__ == "kermac.reference.backend"
    torch.testing.assert_close(kermac.cdist(x, z, backend="torch"), torch.cdist(x, z))


# -- names: reserved, duplicate ---------------------------------------------------------------


@pytest.mark.parametrize("front", [True, False], ids=["before-kermac-on-sys.path", "after-kermac-on-sys.path"])
def test_a_reserved_entry_point_name_is_refused_and_blamed_on_its_distribution(install, front) -> None:
    install("evil-dist", {"torch": EVIL_TORCH}, front=front)
    rows, warns = discover()
    assert_reference_runs_torch()
    assert rows["torch"].distribution == "kermac-core" and not rows["torch"].broken
    row = rows["torch (evil-dist)"]
    assert row.broken and row.distribution == "evil-dist" and row.plugin == "torch"
    assert "distribution evil-dist" in row.reason and "'torch' is reserved for kermac-core" in row.reason
    assert len(warns) == 1 and "distribution evil-dist" in warns[0] and "kermac-core:" not in warns[0]


def test_a_reserved_backend_name_is_refused_and_the_plugins_other_backends_work(install) -> None:
    install("evil-dist", {"evil": EVIL_TORCH.replace("return [Evil()]", "return [Evil(), Ok()]") + OK})
    rows, warns = discover()
    assert_reference_runs_torch()
    assert rows["ok"].available and rows["ok"].distribution == "evil-dist"
    assert rows["evil"].broken and "backend name 'torch' is reserved for kermac-core" in rows["evil"].reason
    assert (
        warns == [f"kermac: {rows['evil'].reason}; skipped"] and "plugin 'evil' of distribution evil-dist" in warns[0]
    )


def test_an_entry_point_name_of_two_distributions_names_both_and_loads_the_first(install) -> None:
    install("fast-one", {"fast": backend_plugin("fast1")}, front=False)
    install("fast-two", {"fast": backend_plugin("fast2")}, front=False)
    rows, warns = discover()
    assert rows["fast1"].available and rows["fast1"].distribution == "fast-one" and "fast2" not in rows
    skipped = rows["fast"]
    assert skipped.broken and skipped.distribution == "fast-two"
    assert "also declared by fast-one" in skipped.reason and "fast-two" in skipped.reason
    assert len(warns) == 1 and "fast-one" in warns[0] and "fast-two" in warns[0]


def test_one_distribution_found_twice_on_sys_path_is_one_plugin(install) -> None:
    """An editable and a site install of the same distribution: no conflict, nothing reported."""
    first = install("fast-one", {"fast": backend_plugin("fast1")})
    second = first.parent.parent / "site-copy" / first.name
    second.mkdir(parents=True)
    for f in first.iterdir():
        (second / f.name).write_text(f.read_text())
    eps = [*metadata.PathDistribution(first).entry_points, *metadata.PathDistribution(second).entry_points]
    assert len(eps) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry.reset(eps)
    assert [r.name for r in kermac.backends()] == ["fast1"]


def test_a_backend_name_registered_twice_names_both_distributions(install) -> None:
    install("maker-a", {"a": backend_plugin("same")}, front=False)
    install("maker-b", {"b": backend_plugin("same")}, front=False)
    rows, warns = discover()
    assert rows["same"].distribution == "maker-a" and not rows["same"].broken
    assert rows["b"].broken and rows["b"].distribution == "maker-b"
    assert "already registered by plugin 'a' of distribution maker-a" in rows["b"].reason
    assert len(warns) == 1 and "maker-a" in warns[0] and "maker-b" in warns[0]


@pytest.mark.parametrize(
    "content",
    [b"[kermac.backends]\nx = \xff\xfe\n", b"[kermac.backends]\nno equals sign\n"],
    ids=["not-utf8", "malformed"],
)
def test_a_distribution_with_unreadable_entry_points_does_not_stop_discovery(install, content) -> None:
    info = install("corrupt-dist", {})
    (info / "entry_points.txt").write_bytes(content)
    install("quick", {"quick": backend_plugin("quick")})
    rows, warns = discover()
    assert rows["quick"].available and rows["quick"].distribution == "quick"
    row = rows["corrupt-dist"]
    assert row.broken and row.reason.startswith("distribution corrupt-dist: its entry points cannot be read (")
    assert warns == [f"kermac: {row.reason}; skipped"]
    assert_reference_runs_torch()


# -- plugins that fail to load ------------------------------------------------------------------

LOAD_FAILURES = {
    "exit-at-import": ("raise SystemExit(3)\n", "failed to load: SystemExit: 3"),
    "generator-exit-at-import": ("raise GeneratorExit('misused')\n", "failed to load: GeneratorExit: misused"),
    "exit-in-hook": (
        "@hookimpl\ndef kermac_backends():\n    sys.exit('bye')\n",
        "failed to load: SystemExit: bye",
    ),
    "exit-in-name": (
        "class N(Correct):\n    @property\n    def name(self):\n        raise SystemExit(4)\n"
        "@hookimpl\ndef kermac_backends():\n    return [N()]\n",
        "failed to load: SystemExit: 4",
    ),
    "not-a-list": (
        "@hookimpl\ndef kermac_backends():\n    return Correct()\n",
        "kermac_backends() returned Correct, expected a list of Backend",
    ),
    "no-hookimpl-marker": (
        "def kermac_backends():\n    return [Correct()]\n",
        "defines no kermac_backends() marked @kermac.hookspecs.hookimpl",
    ),
    "misspelt-hook": (
        "@hookimpl\ndef kermac_backend():\n    return [Correct()]\n",
        "unknown hook 'kermac_backend'",
    ),
    "name-auto": (backend_plugin("auto"), "backend name 'auto' is not a name"),
    "name-with-space": (backend_plugin("my backend"), "backend name 'my backend' is not a name"),
    "name-not-str": (backend_plugin(42), "a backend's name is a int, expected a str"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize(("source", "needle"), LOAD_FAILURES.values(), ids=LOAD_FAILURES.keys())
def test_a_plugin_that_fails_to_load_is_reported_and_skipped(install, source, needle) -> None:
    install("bad-dist", {"bad": source})
    rows, warns = discover()
    assert rows["bad"].broken and not rows["bad"].available and needle in rows["bad"].reason
    assert "plugin 'bad' of distribution bad-dist" in rows["bad"].reason
    assert len(warns) == 1 and needle in warns[0]
    assert_reference_runs_torch()


def test_warnings_turned_into_errors_fail_one_call_not_every_call(install) -> None:
    """Under ``-W error`` (a common pytest setting) a broken plugin is one failed call, then skipped."""
    install("bad-dist", {"bad": "raise ImportError('libbad.so')\n"})
    registry.reset()
    x = torch.randn(3, 2, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(RuntimeWarning, match=r"libbad\.so"):
            kermac.cdist(x, x)
        torch.testing.assert_close(kermac.cdist(x, x), torch.cdist(x, x))


def test_a_keyboard_interrupt_from_a_plugin_propagates_and_is_not_its_error(install) -> None:
    """Regression guard of the loader thread: the interrupt reaches the caller as raised."""
    info = install("bad-dist", {"bad": "raise KeyboardInterrupt('from the plugin')\n"})
    registry.reset()
    with pytest.raises(KeyboardInterrupt, match="from the plugin"):
        kermac.backends()
    (info / "entry_points.txt").write_text("[kermac.backends]\n")  # "uninstalled": discovery is retried
    rows, warns = discover()
    assert "bad" not in rows and warns == []


def test_a_slow_plugin_is_abandoned_after_the_time_limit(install, monkeypatch) -> None:
    monkeypatch.setenv(discovery.ENV_LOAD_TIMEOUT, "0.5")
    install("slow-import", {"slow_import": "time.sleep(4)\n" + backend_plugin("late1")})
    install("slow-hook", {"slow_hook": "@hookimpl\ndef kermac_backends():\n    time.sleep(4)\n    return []\n"})
    install("quick", {"quick": backend_plugin("quick")})
    start = time.perf_counter()
    rows, warns = discover()
    elapsed = time.perf_counter() - start
    assert elapsed < 2.5, f"discovery waited {elapsed:.1f} s"
    for name in ("slow_import", "slow_hook"):
        assert rows[name].broken and f"did not load within 0.5 s ({discovery.ENV_LOAD_TIMEOUT}" in rows[name].reason
        assert ".py:" in rows[name].reason.split("; it was at ")[1]  # the line the plugin was stuck at
    assert "late1" not in rows and rows["quick"].available and len(warns) == 2
    assert_reference_runs_torch()


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_an_invalid_load_timeout_is_a_value_error_naming_the_variable(monkeypatch, value) -> None:
    monkeypatch.setenv(discovery.ENV_LOAD_TIMEOUT, value)
    registry.reset()
    try:
        with pytest.raises(
            ValueError, match=f"{discovery.ENV_LOAD_TIMEOUT}: expected a number of seconds > 0.*{value}"
        ):
            kermac.backends()
    finally:
        monkeypatch.delenv(discovery.ENV_LOAD_TIMEOUT)
        registry.reset()


def test_no_load_time_limit_with_inf(install, monkeypatch) -> None:
    monkeypatch.setenv(discovery.ENV_LOAD_TIMEOUT, "inf")
    install("slow-import", {"slow_import": "time.sleep(0.3)\n" + backend_plugin("late1")})
    rows, warns = discover()
    assert rows["late1"].available and warns == []


def test_a_package_that_uses_kermac_as_it_is_imported_and_ships_the_plugin(tmp_path, monkeypatch) -> None:
    """Its plugin imports the package being imported: a loader thread would wait for the package's
    import lock (held by the caller) past the limit; discovery from a module body loads in the caller."""
    monkeypatch.setenv(discovery.ENV_LOAD_TIMEOUT, "0.5")
    package = f"kermac_fake_pkg_{uuid.uuid4().hex[:12]}"
    root = tmp_path / "site"
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text(
        "SCALE = 2.0\nimport kermac\nROWS = {r.name: r for r in kermac.backends()}\nfrom . import plugin\n"
    )
    (root / package / "plugin.py").write_text(
        textwrap.dedent(HEADER) + f"from {package} import SCALE\n" + backend_plugin("circular")
    )
    info = root / "circular_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: circular-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[kermac.backends]\ncircular = {package}.plugin\n")
    monkeypatch.syspath_prepend(str(root))
    registry.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            module = importlib.import_module(package)
        assert module.ROWS["circular"].available and module.plugin.SCALE == 2.0
    finally:
        registry.reset()
        for name in (package, f"{package}.plugin"):
            sys.modules.pop(name, None)


def test_plugins_load_in_the_caller_where_no_thread_can_start(install, monkeypatch) -> None:
    def refuse(self):
        raise RuntimeError("can't start new thread")

    install("quick", {"quick": backend_plugin("quick")})
    monkeypatch.setattr(threading.Thread, "start", refuse)
    rows, warns = discover()
    assert rows["quick"].available and rows["torch"].available and warns == []


def test_a_plugin_that_calls_kermac_as_it_loads_is_reported_not_deadlocked(install, tmp_path) -> None:
    """Before: discovery held its lock and the plugin waited for it forever (a subprocess, to time out)."""
    info = install("needy", {"needy": "import kermac\nkermac.backends()\n" + backend_plugin("needy")})
    script = (
        "import sys, warnings, json\n"
        f"sys.path.insert(0, {str(info.parent)!r})\n"
        "import kermac\n"
        "warnings.simplefilter('ignore')\n"
        "print(json.dumps({r.name: r.reason for r in kermac.backends()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    reasons = json.loads(done.stdout)
    assert "while its backends were being discovered" in reasons["needy"] and reasons["torch"] is None


# -- hooks that misbehave at selection time -----------------------------------------------------

BREAKERS = """
class BadPriority(Correct):
    name = "bad_priority"

    @property
    def priority(self):
        raise ValueError("no priority today")


class BadAvailability(Correct):
    name = "bad_availability"

    def availability(self):
        raise SystemExit(2)


class GarbageAvailability(Correct):
    name = "garbage_availability"

    def availability(self):
        return True


class BadCheck(Correct):
    name = "bad_check"

    def check_pairwise(self, problem):
        raise ZeroDivisionError("boom")

    def check_grad(self, problem):
        raise SystemExit("bye")


class GarbageCheck(Correct):
    name = "garbage_check"

    def check_pairwise(self, problem):
        return 42

    def check_grad(self, problem):
        return False


class BadPreference(Correct):
    name = "bad_preference"
    priority = 40

    def preference(self, problem):
        raise SystemExit(5)

    def check_pairwise(self, problem):
        return "refuses everything"


class Refusing(Correct):
    name = "refusing"

    def check_pairwise(self, problem):
        return "never"

    def check_grad(self, problem):
        return "never"


@hookimpl
def kermac_backends():
    return [BadPriority(), BadAvailability(), GarbageAvailability(), BadCheck(), GarbageCheck(), BadPreference(),
            Refusing()]
"""

EXPECTED_WARNINGS = {
    "bad_priority": "priority raised ValueError: no priority today",
    "bad_availability": "availability() raised SystemExit: 2",
    "garbage_availability": "availability() returned bool, expected a kermac.backend.Availability",
    "bad_check": "check_pairwise() raised ZeroDivisionError: boom",
    "garbage_check": "check_pairwise() returned int, expected None or a str",
    "bad_preference": "preference() raised SystemExit: 5",
}


@pytest.fixture
def breakers(install) -> None:
    """The backends of BREAKERS installed; discovered on first use (discovery itself finds no problem)."""
    install("breakers-dist", {"breakers": BREAKERS})
    registry.reset()


def test_hook_errors_never_make_auto_raise_and_are_reported_once(breakers) -> None:
    x, z = torch.randn(6, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(kermac.cdist(x, z, p=1.0), torch.cdist(x, z, p=1.0))
    warns = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(warns) == len(EXPECTED_WARNINGS), warns  # once each, although each call met them
    for name, needle in EXPECTED_WARNINGS.items():
        [warning] = [w for w in warns if w.startswith(f"kermac backend {name!r}: ")]
        assert needle in warning and "plugin 'breakers' of distribution breakers-dist" in warning


def test_hook_errors_in_gradient_selection(breakers) -> None:
    a, b, c, d = (torch.randn(*s, dtype=torch.float64) for s in ((3, 4), (2, 3), (2, 3), (2, 4)))
    program = kermac.GradProgram(kermac.ir.Var("d") - kermac.ir.Var("b"), kermac.ir.Var("acc"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = kermac.run_grad_program(program, a, b, c, d)
    warns = " | ".join(str(w.message) for w in caught)
    assert "check_grad() raised SystemExit: bye" in warns and "check_grad() returned bool" in warns
    torch.testing.assert_close(got, kermac.run_grad_program(program, a, b, c, d, backend="torch"))


def test_statuses_show_priority_and_availability_errors(breakers) -> None:
    rows, warns = discover()
    assert len(warns) == 3
    for name in ("bad_priority", "bad_availability", "garbage_availability"):
        assert rows[name].broken and not rows[name].available
        assert rows[name].reason.startswith("plugin error (plugin 'breakers' of distribution breakers-dist): ")
        assert EXPECTED_WARNINGS[name] in rows[name].reason
    assert rows["bad_check"].available and not rows["bad_check"].broken


@pytest.mark.filterwarnings("ignore:kermac backend:RuntimeWarning")  # the other backends' errors, tested above
def test_a_named_backend_whose_hook_fails_raises_a_backend_error(breakers) -> None:
    x = torch.randn(4, 3, dtype=torch.float64)
    plugin = r"plugin error \(plugin 'breakers' of distribution breakers-dist\)"
    with pytest.raises(
        kermac.UnsupportedProblemError,
        match=rf"'bad_check' cannot run this pairwise problem: {plugin}: check_pairwise\(\) raised ZeroDivisionError",
    ) as info:
        kermac.cdist(x, x, backend="bad_check")
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    alternatives = set(str(info.value).split("Backends that can run this pairwise problem: ")[1][:-1].split(", "))
    assert {"torch", "bad_priority"} <= alternatives and not {"bad_check", "garbage_check"} & alternatives
    with pytest.raises(kermac.UnsupportedProblemError, match=rf"{plugin}: check_pairwise\(\) returned int"):
        kermac.cdist(x, x, backend="garbage_check")
    with pytest.raises(kermac.BackendUnavailableError, match=rf"{plugin}: availability\(\) raised SystemExit: 2"):
        kermac.cdist(x, x, backend="bad_availability")
    with pytest.raises(kermac.UnsupportedProblemError, match=r"check_grad\(\) raised SystemExit: bye"):
        kermac.cdist_grad(x.T, x, x, torch.randn(4, 4, dtype=torch.float64), backend="bad_check")
    # priority and preference only rank backends for auto: the backend itself still runs when named
    torch.testing.assert_close(kermac.cdist(x, x, backend="bad_priority"), torch.cdist(x, x))


def test_a_keyboard_interrupt_in_a_hook_propagates(install) -> None:
    """Regression guard: Ctrl-C during a check is the user's, not a plugin error."""
    source = (
        "class K(Correct):\n    name = 'k'\n    def check_pairwise(self, problem):\n        raise KeyboardInterrupt\n"
    )
    install("k-dist", {"k": source + "@hookimpl\ndef kermac_backends():\n    return [K()]\n"})
    discover()
    x = torch.randn(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KeyboardInterrupt):
            kermac.cdist(x, x)


# -- kermac info --------------------------------------------------------------------------------


def test_kermac_info_names_every_plugin_problem(install, monkeypatch, capsys) -> None:
    monkeypatch.setenv(discovery.ENV_LOAD_TIMEOUT, "0.3")
    install("evil-dist", {"torch": EVIL_TORCH})
    install("fast-one", {"fast": backend_plugin("fast1")}, front=False)
    install("fast-two", {"fast": backend_plugin("fast2")}, front=False)
    install("slow-dist", {"slow": "time.sleep(3)\n"})
    install("breakers-dist", {"breakers": BREAKERS})
    registry.reset()
    assert main(["info"]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        if " BROKEN " in line:
            rows[line.split(" BROKEN ")[0].strip()] = line
    assert set(rows) == {
        "torch (evil-dist)",
        "fast",
        "slow",
        "bad_priority",
        "bad_availability",
        "garbage_availability",
    }
    assert "evil-dist" in rows["torch (evil-dist)"] and "reserved for kermac-core" in rows["torch (evil-dist)"]
    assert "fast-one" in rows["fast"] and "fast-two" in rows["fast"]
    assert "slow-dist did not load within 0.3 s" in rows["slow"]
    assert "priority raised ValueError" in rows["bad_priority"]


# -- conformance: a backend that does not write out -----------------------------------------------

PARTIAL_WRITERS = """
class Lazy(Correct):
    '''Writes nothing: out keeps whatever memory held.'''
    name = "lazy"

    def pairwise(self, problem):
        pass

    def grad(self, problem):
        pass


class Half(Correct):
    '''Writes every row but the last.'''
    name = "half"

    def pairwise(self, problem):
        full = torch.empty_like(problem.out)
        super().pairwise(dataclasses.replace(problem, out=full))
        problem.out[..., :-1, :].copy_(full[..., :-1, :])


class Right(Correct):
    name = "right"


@hookimpl
def kermac_backends():
    return [Lazy(), Half(), Right()]
"""


def test_conformance_checks_catch_a_backend_that_leaves_out_unwritten(install) -> None:
    install("writers", {"writers": PARTIAL_WRITERS})
    discover()
    program = presets.l1_distance.lower()
    x, z = torch.randn(2, 7, 5), torch.randn(6, 5)
    for name in ("lazy", "half"):
        with pytest.raises(AssertionError, match=rf"backend '{name}'.*entries differ.*out was left unwritten"):
            testing.assert_pairwise_conforms(name, program, x, z)
    testing.assert_pairwise_conforms("right", program, x, z)
    grad = kermac.GradProgram(kermac.ir.Var("d") - kermac.ir.Var("b"), kermac.ir.Var("acc"))
    a, b, c, d = (torch.randn(*s) for s in ((3, 4), (2, 3), (2, 3), (2, 4)))
    with pytest.raises(AssertionError, match="backend 'lazy', gradient program"):
        testing.assert_grad_conforms("lazy", grad, a, b, c, d)
    testing.assert_grad_conforms("right", grad, a, b, c, d)


def test_conformance_compares_nan_and_inf_exactly() -> None:
    ref = torch.tensor([1.0, float("nan"), float("inf"), -2.0], dtype=torch.float64)
    testing.assert_matches_reference(ref.float(), ref, rtol=None, what="same")
    bad: dict[str, Callable[[torch.Tensor], None]] = {
        "nan for a number": lambda t: t.__setitem__(0, float("nan")),
        "number for nan": lambda t: t.__setitem__(1, 0.0),
        "wrong infinity": lambda t: t.__setitem__(2, -float("inf")),
        "too far": lambda t: t.__setitem__(3, -2.001),
    }
    for what, spoil in bad.items():
        got = ref.clone()
        spoil(got)
        with pytest.raises(AssertionError, match=f"{what}: 1 of 4 entries differ"):
            testing.assert_matches_reference(got, ref, rtol=1e-6, what=what)


@pytest.mark.parametrize("exc", [SystemExit(3), GeneratorExit()])
def test_a_backend_ending_the_process_while_running_is_a_backend_error(monkeypatch, exc) -> None:
    from kermac.errors import BackendError
    from kermac.reference.backend import ReferenceBackend

    def leave(self, problem):
        raise exc

    monkeypatch.setattr(ReferenceBackend, "pairwise", leave)
    monkeypatch.setattr(ReferenceBackend, "grad", leave)
    x = torch.randn(3, 2)
    with pytest.raises(BackendError, match=f"backend 'torch' raised {type(exc).__name__}") as caught:
        kermac.cdist(x, x, backend="torch")
    assert caught.value.__cause__ is exc
    with pytest.raises(BackendError, match="backend 'torch'"):
        kermac.cdist_grad(torch.randn(2, 3), torch.randn(4, 2), torch.randn(1, 2), torch.randn(4, 3), backend="torch")


def test_keyboard_interrupt_while_running_propagates(monkeypatch) -> None:
    from kermac.reference.backend import ReferenceBackend

    def interrupted(self, problem):
        raise KeyboardInterrupt

    monkeypatch.setattr(ReferenceBackend, "pairwise", interrupted)
    with pytest.raises(KeyboardInterrupt):
        kermac.cdist(torch.randn(3, 2), torch.randn(2, 2), backend="torch")
