"""The backend registry: plugins discovered once, on first use, and the choice of backend for a problem.

`auto` ranks the available backends that accept a problem by the cost table of its device
([`kermac.costs`][kermac.costs]: measured milliseconds per problem class), then by `preference()` for the
backends the table does not list (see [`select_backend`][kermac.registry.select_backend]).  A backend's
`priority` and `availability()` are read once per process (per [`reset`][kermac.registry.reset]).

Discovery ([`kermac.discovery`][kermac.discovery]) loads each entry point of `kermac.backends` on its own,
within a time limit; every plugin it refuses or that fails is reported once -- a
`RuntimeWarning` and a `broken` row of [`backend_statuses`][kermac.registry.backend_statuses] (`kermac info`) naming the
plugin, its distribution and why -- and skipped, never fatal to the others.

The backends' hooks are plugin code too: `priority`, `availability()`, `preference()`,
`check_pairwise()`, `check_grad()`, `check_general_grad()`, `check_product()` and `check_product_grad()`.
One that raises
(anything but `KeyboardInterrupt`, which propagates untouched) or returns a value of the wrong type (an int
from `priority` and `preference()`, an `Availability` from `availability()`, None or a str from the checks) is a *plugin
error*: reported once per backend and hook as a `RuntimeWarning`, after which

* `auto` skips that backend for the decision at hand (a failing `preference()` only ranks it
  by its priority; a failing `availability()` counts as unavailable, for the process);
* a backend named explicitly raises [`BackendUnavailableError`][kermac.registry.BackendUnavailableError]
  (`availability()`) or [`UnsupportedProblemError`][kermac.registry.UnsupportedProblemError] (its check), naming the
  plugin and chaining the exception.

[`contract_violations`][kermac.registry.contract_violations] applies the same rules to a loaded backend's
declared fields on request (the conformance suite of [`kermac.testing`][kermac.testing] does).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, TypeVar

from kermac.backend import Availability, Backend
from kermac.costs import CostTables
from kermac.discovery import (
    AUTO,
    Discovery,
    Loaded,
    Plugin,
    check_not_loading,
    describe_exception,
    discover,
    discover_installed,
    load_timeout,
)
from kermac.errors import BackendUnavailableError, UnsupportedProblemError

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "BackendStatus",
    "availability",
    "backend_statuses",
    "contract_violations",
    "cost_tables",
    "get_backend",
    "registered_backends",
    "reset",
    "select_backend",
]

ENV_BACKEND = "KERMAC_BACKEND"

T = TypeVar("T")


@dataclass(frozen=True)
class BackendStatus:
    """One row of [`kermac.backends`][kermac.backends]: a backend (or a plugin with a problem) and whether it can run.

    `broken` marks a plugin error: a plugin that was refused or failed to load (`name` is the
    entry-point name, qualified by the distribution where a backend has that name too), or a
    backend whose `priority` or `availability()` failed.  `reason` says why.
    `distribution` is the distribution that declared the plugin (`None` for a hand-made entry
    point).
    """

    name: str
    available: bool
    reason: str | None
    priority: int
    plugin: str
    version: str | None = None
    broken: bool = False
    distribution: str | None = None


class _PluginError(Exception):
    """A backend hook raised or returned a value of the wrong type; `hook` names it."""

    def __init__(self, hook: str, message: str) -> None:
        super().__init__(message)
        self.hook = hook


@dataclass
class _Registry:
    found: Discovery
    costs: CostTables = field(default_factory=CostTables)
    availability: dict[str, tuple[Availability, bool]] = field(default_factory=dict)  # (value, a plugin error)
    reported: set[tuple[str, str]] = field(default_factory=set)  # (backend, hook) plugin errors warned about
    # auto's candidates: (priority, name, entry) of the available backends of priority >= 0, highest
    # priority first, and why the others are left out; built on auto's first call.
    candidates: tuple[list[tuple[int, str, Loaded]], list[str]] | None = None


_lock = threading.Lock()
_registry: _Registry | None = None


def _warn(found: Discovery) -> None:
    """One `RuntimeWarning` per problem of discovery (after the registry is in place: a warning
    turned into an error by a filter then fails one call, not every call)."""
    for problem in found.problems:
        warnings.warn(f"kermac: {problem.message}; skipped", RuntimeWarning, stacklevel=4)


def _get_registry() -> _Registry:
    global _registry
    check_not_loading()  # a plugin calling kermac as it loads would wait for itself
    reg = _registry
    if reg is None:
        with _lock:
            if _registry is not None:
                return _registry
            reg = _registry = _Registry(discover_installed(load_timeout()))
        _warn(reg.found)
    return reg


def reset(entry_points: Iterable[metadata.EntryPoint] | None = None, *, costs: CostTables | None = None) -> None:
    """Forget discovered backends (tests use this); `entry_points` replaces discovery if given,
    `costs` the shipped cost tables ([`kermac.costs`][kermac.costs]) if given."""
    global _registry
    with _lock:
        if entry_points is None and costs is None:
            _registry = None
        else:
            timeout = load_timeout()
            found = discover_installed(timeout) if entry_points is None else discover(entry_points, timeout)
            _registry = _Registry(found, costs or CostTables())
        reg = _registry
    if reg is not None:
        _warn(reg.found)


def registered_backends() -> dict[str, Backend]:
    """Every successfully loaded backend by name, available or not."""
    return {name: entry.backend for name, entry in _get_registry().found.backends.items()}


def _hook(hook: str, call: Callable[..., T], args: tuple) -> T:
    """`call(*args)`, the backend hook `hook`; `_PluginError` if it raises or returns what `_RESULTS` refuses."""
    valid, expected = _RESULTS[hook]
    try:
        value = call(*args)
        ok = valid(value)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit too: a plugin must not end or unwind the caller
        raise _PluginError(hook, f"{hook} raised {describe_exception(exc)}") from exc
    if not ok:
        raise _PluginError(hook, f"{hook} returned {type(value).__name__}, expected {expected}")
    return value


def _method(obj: object, name: str, *args: object) -> object:
    """`obj.name(*args)`: through `_hook`, the lookup is guarded too (it may be plugin code)."""
    return getattr(obj, name)(*args)


def _is_int(value: object) -> bool:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _is_reason(value: object) -> bool:
    return value is None or isinstance(value, str)


def _is_availability(value: object) -> bool:
    return (
        isinstance(value, Availability)
        and isinstance(value.available, bool)
        and all(v is None or isinstance(v, str) for v in (value.reason, value.version))
    )


# What each declared field and hook of a backend must be: (test, the words for it in a plugin error).
# Every read of a backend hook by the registry, and contract_violations, go through this table
# (`name` only the latter: discovery checks the name it registers a backend under).
_RESULTS: dict[str, tuple[Callable[[object], bool], str]] = {
    "name": (lambda value: isinstance(value, str), "a str"),
    "priority": (_is_int, "an int"),
    "availability()": (
        _is_availability,
        "a kermac.backend.Availability (available: bool; reason, version: str or None)",
    ),
    "preference()": (_is_int, "an int"),
    "check_pairwise()": (_is_reason, "None or a str"),
    "check_grad()": (_is_reason, "None or a str"),
    "check_general_grad()": (_is_reason, "None or a str"),
    "check_product()": (_is_reason, "None or a str"),
    "check_product_grad()": (_is_reason, "None or a str"),
}


def contract_violations(name: str, problems: Iterable[object] = ()) -> list[str]:
    """How the loaded backend `name` breaks the contract of its declared fields: one sentence per
    violation, worded as the registry words the plugin error (empty if there is none).

    Checked: `name` is the str it is registered as, `priority` an int, `availability()` an
    [`Availability`][kermac.backend.Availability] of a bool and str-or-None fields, and `preference(problem)`
    an int for each of `problems`; reading a field or calling a hook that raises is a violation
    too.  The rules are those the registry applies whenever it reads these hooks (a backend that
    breaks them is reported and skipped, as the module docstring says); here every hook is called
    afresh, not read from the registry's once-per-process values.  `ValueError` (from
    [`get_backend`][kermac.registry.get_backend]) if no backend is registered as `name`.
    """
    backend = get_backend(name)
    reads = [("name", getattr, (backend, "name")), ("priority", getattr, (backend, "priority"))]
    reads.append(("availability()", _method, (backend, "availability")))
    reads += [("preference()", _method, (backend, "preference", problem)) for problem in problems]
    violations = []
    for hook, call, args in reads:
        try:
            value = _hook(hook, call, args)
        except _PluginError as err:
            violations.append(str(err))
            continue
        if hook == "name" and value != name:
            violations.append(f"name is {value!r}, but the backend is registered as {name!r}")
    return violations


def _plugin_error(entry: Loaded, err: _PluginError) -> str:
    return f"plugin error ({entry.plugin.label}): {err}"


def _report(reg: _Registry, name: str, entry: Loaded, err: _PluginError, consequence: str) -> None:
    """Warn about a plugin error, once per backend and hook."""
    key = (name, err.hook)
    if key not in reg.reported:
        reg.reported.add(key)
        warnings.warn(
            f"kermac backend {name!r}: {err} ({entry.plugin.label}); {consequence} (reported once)",
            RuntimeWarning,
            stacklevel=4,
        )


def _priority(entry: Loaded) -> int:
    return _hook("priority", getattr, (entry.backend, "priority"))


def _availability(reg: _Registry, name: str, entry: Loaded) -> tuple[Availability, bool]:
    """The backend's availability (computed once per process) and whether it is a plugin error."""
    cached = reg.availability.get(name)
    if cached is None:
        try:
            cached = (_hook("availability()", _method, (entry.backend, "availability")), False)
        except _PluginError as err:
            _report(reg, name, entry, err, "it counts as unavailable")
            cached = (Availability.no(_plugin_error(entry, err)), True)
        reg.availability[name] = cached
    return cached


def availability(name: str) -> Availability:
    """Backend `name`'s availability, asked of it once per process (the answer `auto` and a call naming it read; a
    failing hook counts as unavailable, saying why), without asking any other backend; `ValueError` listing the
    known names for an unknown `name`."""
    reg = _get_registry()
    return _availability(reg, name, _entry(reg, name))[0]


def _preference(reg: _Registry, name: str, entry: Loaded, problem: object, priority: int) -> int:
    """`preference(problem)`; a plugin error is reported and the backend ranked by `priority`."""
    try:
        return _hook("preference()", _method, (entry.backend, "preference", problem))
    except _PluginError as err:
        _report(reg, name, entry, err, "ranked by its priority instead")
        return priority


def _check_hook(problem: object) -> str:
    """The name of the hook that `check` calls for `problem` (for messages)."""
    return f"{problem.hooks[0]}()"


def _check(entry: Loaded, problem: object, check: Callable[[Backend, object], str | None], hook: str) -> str | None:
    return _hook(hook, check, (entry.backend, problem))


def backend_statuses() -> list[BackendStatus]:
    """Every backend with availability (and why not), then one row per plugin with a problem."""
    reg = _get_registry()
    rows = []
    for name, entry in reg.found.backends.items():
        plugin = entry.plugin
        try:
            priority = _priority(entry)
        except _PluginError as err:
            _report(reg, name, entry, err, "auto skips it")
            rows.append(
                BackendStatus(name, False, _plugin_error(entry, err), 0, plugin.name, None, True, plugin.distribution)
            )
            continue
        av, failed = _availability(reg, name, entry)
        row = BackendStatus(
            name, av.available, av.reason, priority, plugin.name, av.version, failed, plugin.distribution
        )
        rows.append(row)
    rows.sort(key=lambda s: -s.priority)  # stable: registration order among equals
    return rows + _problem_rows(reg)


def _problem_rows(reg: _Registry) -> list[BackendStatus]:
    """One row per plugin with problems, named so that no two rows share a name."""
    merged: dict[Plugin, list[str]] = {}
    for problem in reg.found.problems:
        merged.setdefault(problem.plugin, []).append(problem.message)
    taken = set(reg.found.backends)
    rows = []
    for plugin, messages in merged.items():
        name = plugin.name if plugin.name not in taken else f"{plugin.name} ({plugin.source})"
        taken.add(name)
        rows.append(BackendStatus(name, False, "; ".join(messages), 0, plugin.name, None, True, plugin.distribution))
    return rows


def cost_tables() -> CostTables:
    """The cost tables `auto` ranks by ([`kermac.costs`][kermac.costs])."""
    return _get_registry().costs


def get_backend(name: str) -> Backend:
    """The backend registered as `name`; `ValueError` listing the known names otherwise."""
    return _entry(_get_registry(), name).backend


def _entry(reg: _Registry, name: str) -> Loaded:
    entry = reg.found.backends.get(name)
    if entry is None:
        known = ", ".join(sorted(reg.found.backends)) or "none"
        broken = sorted({p.plugin.name for p in reg.found.problems})
        extra = f" (broken plugins: {', '.join(broken)})" if broken else ""
        raise ValueError(f"backend: expected 'auto' or one of {known}{extra}; got {name!r}")
    return entry


def requested_backend(backend: str) -> str:
    """Apply the `KERMAC_BACKEND` override to the default `'auto'`."""
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str ('auto' or a backend name), got {type(backend).__name__}")
    if backend == AUTO:
        return os.environ.get(ENV_BACKEND, "").strip() or AUTO
    return backend


def select_backend(backend: str, problem: object, check: Callable[[Backend, object], str | None], what: str) -> Backend:
    """Choose the backend that runs `problem`.

    `backend='auto'` takes, among the backends that are available and whose `check` accepts
    the problem (never one of negative priority: those are opt-in), the cheapest by the cost table
    of the problem's device and class ([`kermac.costs`][kermac.costs]); backends the table does not list for
    that class come after those it lists, by [`preference`][kermac.backend.Backend.preference] (their
    priority unless they know better; ties go to the higher priority).  A name forces that backend
    and raises [`BackendUnavailableError`][kermac.registry.BackendUnavailableError] or
    [`UnsupportedProblemError`][kermac.registry.UnsupportedProblemError] (naming the backends that would work) if it
    cannot.  Plugin errors are handled as the module docstring says; a malformed cost table raises
    [`kermac.costs.CostTableError`][kermac.costs.CostTableError].
    """
    name = requested_backend(backend)
    reg = _get_registry()
    if name != AUTO:
        return _forced(reg, name, problem, check, what)
    costs = reg.costs.costs(problem)
    candidates, left_out = _auto_candidates(reg)
    reasons = list(left_out)
    ranked = []
    for priority, bname, entry in candidates:
        ms = costs.get(bname)
        if ms is not None:  # measured: ahead of every unmeasured backend, the fastest first
            rank = (1, -ms, priority)
        else:
            rank = (0, _preference(reg, bname, entry, problem, priority), priority)
        ranked.append((rank, bname, entry))
    # Best first (the sort is stable: registration order among equals); only as many checks as it
    # takes to find one that accepts.
    ranked.sort(key=lambda r: r[0], reverse=True)
    for _, bname, entry in ranked:
        try:
            reason = _check(entry, problem, check, _check_hook(problem))
        except _PluginError as err:
            _report(reg, bname, entry, err, "auto skips it where it fails")
            reason = _plugin_error(entry, err)
        if reason is None:
            return entry.backend
        reasons.append(f"{bname}: {reason}")
    raise UnsupportedProblemError(f"no backend can run this {what} ({'; '.join(reasons) or 'no backends registered'})")


def _auto_candidates(reg: _Registry) -> tuple[list[tuple[int, str, Loaded]], list[str]]:
    """`auto`'s candidates and why the other backends are not among them, computed once per registry
    (priorities and availability are facts of a backend in a process; reading them once keeps `auto`
    within a few microseconds of a named backend)."""
    cached = reg.candidates
    if cached is not None:
        return cached
    reasons, candidates = [], []
    for bname, entry in reg.found.backends.items():
        try:
            candidates.append((_priority(entry), bname, entry))
        except _PluginError as err:
            _report(reg, bname, entry, err, "auto skips it")
            reasons.append(f"{bname}: {_plugin_error(entry, err)}")
    candidates.sort(key=lambda c: -c[0])
    available = []
    for priority, bname, entry in candidates:
        if priority < 0:
            continue  # opt-in backends run only when named
        av, _ = _availability(reg, bname, entry)
        if not av.available:
            reasons.append(f"{bname}: {av.reason}")
            continue
        available.append((priority, bname, entry))
    reg.candidates = (available, reasons)
    return reg.candidates


def _forced(
    reg: _Registry, name: str, problem: object, check: Callable[[Backend, object], str | None], what: str
) -> Backend:
    entry = _entry(reg, name)
    av, _ = _availability(reg, name, entry)
    if not av.available:
        alternatives = _alternatives(reg, name, problem, check, what)
        raise BackendUnavailableError(f"backend {name!r} is unavailable: {av.reason}.{alternatives}")
    try:
        reason = _check(entry, problem, check, _check_hook(problem))
    except _PluginError as err:
        alternatives = _alternatives(reg, name, problem, check, what)
        message = f"backend {name!r} cannot run this {what}: {_plugin_error(entry, err)}.{alternatives}"
        raise UnsupportedProblemError(message) from err.__cause__ or err
    if reason is not None:
        alternatives = _alternatives(reg, name, problem, check, what)
        raise UnsupportedProblemError(f"backend {name!r} cannot run this {what}: {reason}.{alternatives}")
    return entry.backend


def _alternatives(
    reg: _Registry, failed: str, problem: object, check: Callable[[Backend, object], str | None], what: str
) -> str:
    """` Backends that can run this <what>: a, b.` (every other available backend whose check accepts)."""
    ok = []
    for name, entry in reg.found.backends.items():
        if name == failed or not _availability(reg, name, entry)[0].available:
            continue
        try:
            if _check(entry, problem, check, _check_hook(problem)) is None:
                ok.append(name)
        except _PluginError as err:
            _report(reg, name, entry, err, "auto skips it where it fails")
    return f" Backends that can run this {what}: {', '.join(ok)}." if ok else ""
