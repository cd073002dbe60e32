"""Backend discovery (pluggy over the ``kermac.backends`` entry points) and selection.

Discovery happens once, on first use.  Each entry point is loaded on its own: a plugin that fails
to import or to return backends is recorded as *broken* and reported by :func:`backend_statuses`
and ``kermac info`` (and a warning), never fatal to the others.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING

import pluggy

from kermac import hookspecs
from kermac.backend import Availability, Backend
from kermac.errors import BackendUnavailableError, UnsupportedProblemError

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["BackendStatus", "backend_statuses", "get_backend", "registered_backends", "reset", "select_backend"]

AUTO = "auto"
ENV_BACKEND = "KERMAC_BACKEND"


@dataclass(frozen=True)
class BackendStatus:
    """One row of :func:`kermac.backends`: a backend (or a broken plugin) and whether it can run."""

    name: str
    available: bool
    reason: str | None
    priority: int
    plugin: str
    version: str | None = None
    broken: bool = False


@dataclass
class _Registry:
    backends: dict[str, Backend]
    plugins: dict[str, str]  # backend name -> plugin (entry point) name
    broken: dict[str, str]  # plugin name -> error


_lock = threading.Lock()
_registry: _Registry | None = None
_availability: dict[str, Availability] = {}


def _plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _discover(entry_points: Iterable[metadata.EntryPoint]) -> _Registry:
    reg = _Registry({}, {}, {})
    for ep in entry_points:
        try:
            plugin = ep.load()
            pm = _plugin_manager()
            pm.register(plugin, name=ep.name)
            found = [b for result in pm.hook.kermac_backends() for b in result]
            for b in found:
                if not isinstance(b, Backend):
                    raise TypeError(f"kermac_backends() returned {type(b).__name__}, expected a kermac.backend.Backend")
        except Exception as exc:  # a broken plugin must not take the others down
            reg.broken[ep.name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"kermac: backend plugin {ep.name!r} ({ep.value}) is broken and was skipped: {exc}",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        for b in found:
            if b.name in reg.backends:
                reg.broken[ep.name] = f"backend name {b.name!r} already registered by plugin {reg.plugins[b.name]!r}"
                warnings.warn(
                    f"kermac: {reg.broken[ep.name]}; the one from {ep.name!r} was skipped", RuntimeWarning, stacklevel=3
                )
                continue
            reg.backends[b.name] = b
            reg.plugins[b.name] = ep.name
    return reg


def _get_registry() -> _Registry:
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                eps = metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP)
                # Deduplicate: the same distribution can appear twice on sys.path (editable + site).
                unique = {ep.name: ep for ep in eps}
                _registry = _discover(unique.values())
    return _registry


def reset(entry_points: Iterable[metadata.EntryPoint] | None = None) -> None:
    """Forget discovered backends (tests use this); ``entry_points`` replaces discovery if given."""
    global _registry
    with _lock:
        _availability.clear()
        _registry = None if entry_points is None else _discover(entry_points)


def registered_backends() -> dict[str, Backend]:
    """Every successfully loaded backend by name, available or not."""
    return dict(_get_registry().backends)


def availability(backend: Backend) -> Availability:
    """The backend's availability, computed once per process; a raising check counts as 'no'."""
    cached = _availability.get(backend.name)
    if cached is None:
        try:
            cached = backend.availability()
        except Exception as exc:
            cached = Availability.no(f"availability check raised {type(exc).__name__}: {exc}")
        _availability[backend.name] = cached
    return cached


def backend_statuses() -> list[BackendStatus]:
    """Every backend with availability (and why not), plus one row per broken plugin."""
    reg = _get_registry()
    rows = []
    for name, b in sorted(reg.backends.items(), key=lambda kv: -kv[1].priority):
        av = availability(b)
        rows.append(BackendStatus(name, av.available, av.reason, b.priority, reg.plugins[name], av.version))
    for plugin, err in sorted(reg.broken.items()):
        rows.append(BackendStatus(plugin, False, f"plugin failed to load: {err}", 0, plugin, None, broken=True))
    return rows


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``; ``ValueError`` listing the known names otherwise."""
    reg = _get_registry()
    try:
        return reg.backends[name]
    except KeyError:
        known = ", ".join(sorted(reg.backends)) or "none"
        extra = f" (broken plugins: {', '.join(sorted(reg.broken))})" if reg.broken else ""
        raise ValueError(f"backend: expected 'auto' or one of {known}{extra}; got {name!r}") from None


def requested_backend(backend: str) -> str:
    """Apply the ``KERMAC_BACKEND`` override to the default ``'auto'``."""
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str ('auto' or a backend name), got {type(backend).__name__}")
    if backend == AUTO:
        return os.environ.get(ENV_BACKEND, "").strip() or AUTO
    return backend


def select_backend(backend: str, problem: object, check: Callable[[Backend, object], str | None], what: str) -> Backend:
    """Choose the backend that runs ``problem``.

    ``backend='auto'`` takes, among the backends that are available and whose ``check`` accepts
    the problem (never one of negative priority: those are opt-in), the one of highest
    :meth:`~kermac.backend.Backend.preference` for it (its priority unless it knows better; ties
    go to the higher priority); a name forces that
    backend and raises :class:`BackendUnavailableError` or
    :class:`UnsupportedProblemError` (naming the backends that would work) if it cannot.
    """
    name = requested_backend(backend)
    if name != AUTO:
        chosen = get_backend(name)
        av = availability(chosen)
        if not av.available:
            raise BackendUnavailableError(
                f"backend {name!r} is unavailable: {av.reason}.{_alternatives(problem, check, what)}"
            )
        reason = check(chosen, problem)
        if reason is not None:
            raise UnsupportedProblemError(
                f"backend {name!r} cannot run this {what}: {reason}.{_alternatives(problem, check, what)}"
            )
        return chosen
    reasons, ranked = [], []
    # Each backend's priority is read once per call (a property may compute it).
    by_priority = sorted(((b.priority, b) for b in _get_registry().backends.values()), key=lambda pb: -pb[0])
    for priority, b in by_priority:
        if priority < 0:
            continue  # opt-in backends run only when named
        av = availability(b)
        if av.available:
            ranked.append((_preference(b, problem, priority), priority, b))
        else:
            reasons.append(f"{b.name}: {av.reason}")
    # Most preferred first; only as many checks as it takes to find one that accepts.
    ranked.sort(key=lambda r: r[:2], reverse=True)
    for _, _, b in ranked:
        reason = check(b, problem)
        if reason is None:
            return b
        reasons.append(f"{b.name}: {reason}")
    raise UnsupportedProblemError(f"no backend can run this {what} ({'; '.join(reasons) or 'no backends registered'})")


def _preference(b: Backend, problem: object, priority: int) -> int:
    """``b.preference(problem)``; a plugin whose hook raises is warned about and ranked by ``priority``."""
    try:
        return int(b.preference(problem))
    except Exception as exc:
        warnings.warn(
            f"kermac backend {b.name!r}: preference() raised {type(exc).__name__}: {exc}; using its priority",
            RuntimeWarning,
            stacklevel=4,
        )
        return priority


def _alternatives(problem: object, check: Callable[[Backend, object], str | None], what: str) -> str:
    ok = [b.name for b in registered_backends().values() if availability(b).available and check(b, problem) is None]
    return f" Backends that can run this {what}: {', '.join(ok)}." if ok else ""
