"""Backend discovery and selection: third-party plugins installed from a temporary directory."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kermac
from kermac import registry

PLUGINS = {
    # Available, priority above the reference, refuses float64 so `auto` must fall through.
    "fake_good": """
        import torch
        from kermac.backend import Availability, Backend
        from kermac.hookspecs import hookimpl
        from kermac.reference.backend import ReferenceBackend

        CALLS = []

        class FakeBackend(Backend):
            name = "fake"
            priority = 50

            def availability(self):
                return Availability.yes("9.9")

            def check_pairwise(self, problem):
                return "float64 is not supported" if problem.dtype == torch.float64 else None

            def pairwise(self, problem):
                CALLS.append(problem.program.key())
                ReferenceBackend().pairwise(problem)

            def check_grad(self, problem):
                return "no gradients here"

            def grad(self, problem):
                raise AssertionError("never selected")

        @hookimpl
        def kermac_backends():
            return [FakeBackend()]
    """,
    # Installed but cannot run here.
    "fake_unavailable": """
        from kermac.backend import Availability, Backend
        from kermac.hookspecs import hookimpl

        class Missing(Backend):
            name = "missing"
            priority = 99

            def availability(self):
                return Availability.no("needs the FakeAccelerator 3000")

            def check_pairwise(self, problem):
                return None

            def pairwise(self, problem):
                raise AssertionError("unavailable backend was run")

            def check_grad(self, problem):
                return None

            def grad(self, problem):
                raise AssertionError("unavailable backend was run")

        @hookimpl
        def kermac_backends():
            return [Missing()]
    """,
    # Opt-in (negative priority): runs only when named.
    "fake_optin": """
        from kermac.backend import Availability, Backend
        from kermac.hookspecs import hookimpl
        from kermac.reference.backend import ReferenceBackend

        CALLS = []

        class Emulator(Backend):
            name = "emulator"
            priority = -10

            def availability(self):
                return Availability.yes()

            def check_pairwise(self, problem):
                return None

            def pairwise(self, problem):
                CALLS.append(problem.program.key())
                ReferenceBackend().pairwise(problem)

            def check_grad(self, problem):
                return None

            def grad(self, problem):
                ReferenceBackend().grad(problem)

        @hookimpl
        def kermac_backends():
            return [Emulator()]
    """,
    # Low priority, but prefers itself for problems with D = 7; its preference hook breaks for D = 9.
    "fake_preferring": """
        from kermac.hookspecs import hookimpl
        from kermac.problem import PairwiseProblem
        from kermac.reference.backend import ReferenceBackend

        CALLS = []

        class Specialist(ReferenceBackend):
            name = "specialist"
            priority = 5

            def preference(self, problem):
                if not isinstance(problem, PairwiseProblem):
                    return self.priority
                if problem.d == 9:
                    raise ZeroDivisionError("broken hook")
                return 60 if problem.d == 7 else self.priority

            def pairwise(self, problem):
                CALLS.append(problem.program.key())
                super().pairwise(problem)

            def check_grad(self, problem):
                return "no gradients here"

        @hookimpl
        def kermac_backends():
            return [Specialist()]
    """,
    # Fails at import.
    "fake_broken": """
        raise ImportError("libfake.so: cannot open shared object file")
    """,
}


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install the fake plugins as a distribution with entry points in ``tmp_path``."""
    for name, source in PLUGINS.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    info = tmp_path / "fake_kermac_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-kermac-plugins\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kermac.backends]\n" + "".join(f"{name} = {name}\n" for name in PLUGINS))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(RuntimeWarning, match="fake_broken"):
        registry.reset()
        statuses = {s.name: s for s in kermac.backends()}
    yield statuses
    for name in PLUGINS:
        sys.modules.pop(name, None)
    registry.reset()


def test_discovered_and_reported(plugins) -> None:
    assert plugins["fake"].available and plugins["fake"].version == "9.9"
    assert not plugins["missing"].available and "FakeAccelerator" in plugins["missing"].reason
    assert plugins["fake_broken"].broken and "libfake.so" in plugins["fake_broken"].reason
    assert plugins["torch"].available


def test_one_backends_availability_is_asked_once_and_of_it_alone(plugins, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(RuntimeWarning, match="fake_broken"):  # discovery again: nothing asked yet
        registry.reset()
        registry.registered_backends()
    asked = []
    for name in ("fake", "missing"):
        backend = registry.get_backend(name)
        answer = backend.availability
        monkeypatch.setattr(backend, "availability", lambda answer=answer, name=name: asked.append(name) or answer())
    assert registry.availability("fake").version == "9.9"
    assert registry.availability("fake").available and asked == ["fake"]  # the second answer is the first
    assert "FakeAccelerator" in registry.availability("missing").reason and asked == ["fake", "missing"]
    kermac.cdist(torch.randn(3, 2), torch.randn(2, 2), backend="fake")  # a call naming it reads the same answer
    assert asked == ["fake", "missing"]
    with pytest.raises(ValueError, match="nope"):
        registry.availability("nope")


def test_auto_prefers_priority_and_falls_through(plugins) -> None:
    import fake_good

    x = torch.randn(4, 3)
    kermac.cdist(x, x, p=1.0)
    assert len(fake_good.CALLS) == 1  # the fake (priority 50) beat torch (0); 'missing' (99) was skipped
    kermac.cdist(x.double(), x.double(), p=1.0)
    assert len(fake_good.CALLS) == 1  # float64 refused by the fake: torch ran it


def test_preference_overrides_priority_per_problem(plugins) -> None:
    import fake_good
    import fake_preferring

    x = torch.randn(4, 7)
    kermac.cdist(x, x, p=1.0)
    assert len(fake_preferring.CALLS) == 1 and fake_good.CALLS == []  # preference 60 beat priority 50
    x = torch.randn(4, 3)
    kermac.cdist(x, x, p=1.0)
    assert len(fake_preferring.CALLS) == 1 and len(fake_good.CALLS) == 1  # elsewhere: priority 5 < 50


def test_a_raising_preference_warns_and_ranks_by_priority(plugins) -> None:
    import fake_good

    x = torch.randn(4, 9)
    with pytest.warns(RuntimeWarning, match=r"'specialist': preference\(\) raised ZeroDivisionError: broken hook"):
        kermac.cdist(x, x, p=1.0)
    assert len(fake_good.CALLS) == 1


def test_negative_priority_is_opt_in(plugins) -> None:
    import fake_optin

    x = torch.randn(4, 3, dtype=torch.float64)
    kermac.cdist(x, x)
    assert fake_optin.CALLS == []  # auto never picks an opt-in backend
    kermac.cdist(x, x, backend="emulator")
    assert len(fake_optin.CALLS) == 1


def test_forcing(plugins, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(4, 3)
    with pytest.raises(
        kermac.BackendUnavailableError,
        match=r"'missing' is unavailable: needs the FakeAccelerator 3000.*can run this pairwise problem: .*fake.*torch",
    ):
        kermac.cdist(x, x, backend="missing")
    with pytest.raises(
        kermac.UnsupportedProblemError,
        match=r"'fake' cannot run this pairwise problem: float64 is not supported.*torch",
    ):
        kermac.cdist(x.double(), x.double(), backend="fake")
    with pytest.raises(
        kermac.UnsupportedProblemError, match="'fake' cannot run this gradient problem: no gradients here"
    ):
        kermac.cdist_grad(x.T, x, x, torch.randn(4, 4), backend="fake")
    with pytest.raises(ValueError, match="broken plugins: fake_broken"):
        kermac.cdist(x, x, backend="fake_broken")


def test_environment_override(plugins, monkeypatch: pytest.MonkeyPatch) -> None:
    import fake_good

    x = torch.randn(4, 3)
    monkeypatch.setenv("KERMAC_BACKEND", "torch")
    kermac.cdist(x, x)
    assert fake_good.CALLS == []  # the default 'auto' became 'torch'
    kermac.cdist(x, x, backend="fake")
    assert len(fake_good.CALLS) == 1  # an explicit name wins over the variable


def test_debug_logs_the_choice(plugins, caplog: pytest.LogCaptureFixture) -> None:
    x = torch.randn(4, 3)
    with caplog.at_level("DEBUG", logger="kermac"):
        kermac.cdist(x, x, p=1.5, debug=True)
    assert "cdist: backend fake" in caplog.text and "M=4 N=4 D=3" in caplog.text
