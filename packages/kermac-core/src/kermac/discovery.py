"""Backend discovery: the entry points of `kermac.backends` -> backends, and every problem found.

Each entry point is a *plugin*.  [`discover`][kermac.discovery.discover] loads the plugins one by one and refuses, as a
[`Problem`][kermac.discovery.Problem] naming the plugin and its distribution, whatever would let one plugin break
kermac or another plugin (the rules are listed in [`kermac.hookspecs`][kermac.hookspecs]):

* an entry-point or backend name of [`RESERVED`][kermac.hookspecs.RESERVED] claimed by a distribution
  that does not own it (the owner's plugin keeps working, whatever the order on `sys.path`);
* an entry-point name declared by two distributions (the first one is loaded; the same
  distribution found twice, e.g. an editable and a site install, is one plugin);
* a backend name registered twice, or not a valid name;
* a plugin whose import or `kermac_backends()` raises -- any exception, `SystemExit`
  included; only `KeyboardInterrupt` propagates -- returns something other than backends, or
  takes longer than the load time limit.

The time limit: each plugin is imported, and its hook called, in a daemon thread that discovery
waits for at most [`load_timeout`][kermac.discovery.load_timeout] seconds; a plugin still running then is recorded (with
the line it was at) and abandoned (its thread finishes, or not, on its own; its result is never
used).  Two cases load in the calling thread, without
a limit: no thread can be started, and kermac is first used from the body of a module being
imported (the caller holds that module's import lock; a loader thread needing the same module
would wait for it, maybe for good).  A plugin that calls kermac while it loads gets a
`RuntimeError` (discovery is in progress; waiting for it would deadlock).
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata

import pluggy

from kermac import hookspecs
from kermac.backend import Backend

__all__ = [
    "AUTO",
    "DEFAULT_LOAD_TIMEOUT",
    "ENV_LOAD_TIMEOUT",
    "Discovery",
    "Loaded",
    "Plugin",
    "Problem",
    "check_not_loading",
    "describe_exception",
    "discover",
    "discover_installed",
    "load_timeout",
]

ENV_LOAD_TIMEOUT = "KERMAC_PLUGIN_LOAD_TIMEOUT"
DEFAULT_LOAD_TIMEOUT = 5.0  # seconds; a light plugin module imports in milliseconds

_VALID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
AUTO = "auto"
"""What `backend=` takes to let kermac choose; no backend may be named so."""


@dataclass(frozen=True)
class Plugin:
    """One entry point: its `name`, what it loads (`value`) and the distribution declaring it.

    `distribution` is the normalised project name (`kermac-core`), or `None` for an entry
    point built by hand and handed to [`discover`][kermac.discovery.discover] (only in-process code does that, so it is
    trusted with any name).
    """

    name: str
    value: str
    distribution: str | None

    @property
    def label(self) -> str:
        """How messages name the plugin: `plugin 'x' of distribution y` (or `of module v`)."""
        where = f"distribution {self.distribution}" if self.distribution is not None else f"module {self.value}"
        return f"plugin {self.name!r} of {where}"

    @property
    def source(self) -> str:
        """The distribution, or the loaded module for a hand-made entry point."""
        return self.distribution if self.distribution is not None else self.value

    def may_use(self, name: str) -> bool:
        """Whether this plugin may use `name` (entry-point or backend name): not another's reserved one."""
        owner = hookspecs.RESERVED.get(name)
        return owner is None or self.distribution is None or self.distribution == owner


@dataclass(frozen=True)
class Problem:
    """Why (part of) a plugin was skipped; `message` names the plugin and its distribution."""

    plugin: Plugin
    message: str


@dataclass(frozen=True)
class Loaded:
    """A registered backend and the plugin that provided it."""

    backend: Backend
    plugin: Plugin


@dataclass
class Discovery:
    """What [`discover`][kermac.discovery.discover] found: backends by name, and every problem in discovery order."""

    backends: dict[str, Loaded] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


class _LoaderState(threading.local):
    """Per thread: the plugin this thread is loading, if any (a class default keeps the read cheap)."""

    plugin: Plugin | None = None


_loader = _LoaderState()


def load_timeout() -> float | None:
    """Seconds to wait for each plugin (`KERMAC_PLUGIN_LOAD_TIMEOUT`, default 5); `None`: no limit.

    The variable takes a number of seconds > 0, or `inf` for no limit; anything else is a
    `ValueError` naming it.
    """
    text = os.environ.get(ENV_LOAD_TIMEOUT, "").strip()
    if not text:
        return DEFAULT_LOAD_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise ValueError(f"{ENV_LOAD_TIMEOUT}: expected a number of seconds > 0 (or 'inf' for no limit), got {text!r}")
    return None if math.isinf(value) else value


def check_not_loading() -> None:
    """Raise `RuntimeError` in a thread that is loading a plugin (it must not use kermac yet)."""
    plugin = _loader.plugin
    if plugin is not None:
        raise RuntimeError(
            f"kermac was called while its backends were being discovered, by the {plugin.label} as it loaded; "
            "a plugin must not use kermac at import or in kermac_backends()"
        )


def describe_exception(exc: BaseException) -> str:
    """`'TypeName: message'`, even for an exception whose `__str__` raises."""
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def discover(entry_points: Iterable[metadata.EntryPoint], timeout: float | None) -> Discovery:
    """Load every plugin of `entry_points` (in order), each within `timeout` seconds (`None`: no limit).

    Runs plugin code (imports, `kermac_backends()`, the backends' `name`); raises only
    `KeyboardInterrupt` (re-raised from a plugin untouched).
    """
    found = Discovery()
    threaded = not _importing()
    for plugin, ep in _accepted(entry_points, found.problems):
        outcome = _load_with_limit(plugin, ep, timeout, threaded)
        if isinstance(outcome, str):
            found.problems.append(Problem(plugin, f"{plugin.label} {outcome}"))
            continue
        for name, backend in outcome:
            _register(found, plugin, name, backend)
    return found


def discover_installed(timeout: float | None) -> Discovery:
    """[`discover`][kermac.discovery.discover] over the installed distributions' entry points of `kermac.backends`.

    A distribution whose entry-point metadata cannot be read (not UTF-8, malformed) is a problem
    of its own, not the end of discovery: the other distributions' plugins still load.
    """
    group = hookspecs.ENTRY_POINT_GROUP
    problems: list[Problem] = []
    try:
        eps = list(metadata.entry_points(group=group))
    except Exception:  # some distribution's entry_points.txt is unreadable: go through them one by one
        eps, seen = [], set()
        for dist in metadata.distributions():
            name = _distribution_name(dist)
            if name in seen:
                continue  # the same distribution again, further down sys.path (as importlib.metadata does)
            seen.add(name)
            try:
                eps.extend(dist.entry_points.select(group=group))
            except Exception as exc:
                message = f"distribution {name}: its entry points cannot be read ({describe_exception(exc)})"
                problems.append(Problem(Plugin(name, "entry_points.txt", name), message))
    found = discover(eps, timeout)
    found.problems[:0] = problems
    return found


def _distribution_name(dist: metadata.Distribution) -> str:
    """The normalised project name of `dist` (`"<unnamed distribution>"` if unreadable)."""
    try:
        name = dist.name
    except Exception:  # unreadable metadata: a distribution, but not one that owns anything
        name = None
    return re.sub(r"[-_.]+", "-", name).lower() if isinstance(name, str) else "<unnamed distribution>"


def _plugin(ep: metadata.EntryPoint) -> Plugin:
    dist = getattr(ep, "dist", None)
    return Plugin(ep.name, ep.value, None if dist is None else _distribution_name(dist))


def _accepted(
    entry_points: Iterable[metadata.EntryPoint], problems: list[Problem]
) -> list[tuple[Plugin, metadata.EntryPoint]]:
    """The entry points to load: reserved names and names taken by another distribution refused."""
    first: dict[str, Plugin] = {}
    accepted = []
    for ep in entry_points:
        plugin = _plugin(ep)
        if not plugin.may_use(plugin.name):
            owner = hookspecs.RESERVED[plugin.name]
            problems.append(
                Problem(plugin, f"{plugin.label}: the entry-point name {plugin.name!r} is reserved for {owner}")
            )
            continue
        seen = first.get(plugin.name)
        if seen is None:
            first[plugin.name] = plugin
            accepted.append((plugin, ep))
        elif seen.source != plugin.source:
            problems.append(
                Problem(
                    plugin,
                    f"{plugin.label}: the entry-point name {plugin.name!r} is also declared by {seen.source}, "
                    f"whose plugin is the one loaded (uninstall one of {seen.source} and {plugin.source})",
                )
            )
        # else: the same distribution found twice on sys.path (editable + site install): one plugin
    return accepted


def _load(plugin: Plugin, ep: metadata.EntryPoint) -> list[tuple[object, Backend]]:
    """Import the plugin and call its hook (in a loader thread); its backends with their names."""
    module = ep.load()
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    pm.register(module, name=plugin.name)
    pm.check_pending()  # a misspelt @hookimpl raises here instead of silently providing nothing
    if not pm.hook.kermac_backends.get_hookimpls():
        raise TypeError("it defines no kermac_backends() marked @kermac.hookspecs.hookimpl")
    found = []
    for result in pm.hook.kermac_backends():
        if not isinstance(result, (list, tuple)):
            raise TypeError(f"kermac_backends() returned {type(result).__name__}, expected a list of Backend")
        for b in result:
            if not isinstance(b, Backend):
                raise TypeError(f"kermac_backends() returned a {type(b).__name__}, expected a kermac.backend.Backend")
            found.append((b.name, b))  # read here: a `name` property runs under the time limit too
    return found


def _importing() -> bool:
    """Whether this thread is running the body of a module being imported (so it holds that module's lock).

    A loader thread importing that module too would wait for the lock until the caller's import
    ends: past the time limit, or for good where the caller then imports the plugin's module (a
    package that uses kermac as it is imported and ships the plugin).  So plugins then load in the
    caller, as an import there would.
    """
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__", "__main__") != "__main__":
            return True
        frame = frame.f_back
    return False


def _load_with_limit(
    plugin: Plugin, ep: metadata.EntryPoint, timeout: float | None, threaded: bool
) -> list[tuple[object, Backend]] | str:
    """`_load`, in a daemon thread if `threaded`; its result, or what went wrong (`'failed to load: ...'`)."""
    box: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        _loader.plugin = plugin
        try:
            box["value"] = _load(plugin, ep)
        except BaseException as exc:  # SystemExit, GeneratorExit, ... are this plugin's errors too
            box["error"] = exc
        finally:
            _loader.plugin = None
            done.set()

    thread = threading.Thread(target=run, name=f"kermac-plugin-{plugin.name}", daemon=True) if threaded else None
    if thread is not None:
        try:
            thread.start()
        except RuntimeError:  # no thread to be had (a limit, interpreter shutdown)
            thread = None
    if thread is None:
        run()  # here, without a limit
    elif not done.wait(timeout):  # a Ctrl-C here interrupts the wait and propagates
        return f"did not load within {timeout:g} s ({ENV_LOAD_TIMEOUT} sets the limit){_where(thread)}"
    error = box.get("error")
    if isinstance(error, KeyboardInterrupt):
        raise error  # never the plugin's error: let it propagate as raised
    if error is not None:
        return f"failed to load: {describe_exception(error)}"  # type: ignore[arg-type]
    return box["value"]  # type: ignore[return-value]


def _where(thread: threading.Thread) -> str:
    """`'; it was at file:line'`: the plugin code a loader thread is running (outside importlib)."""
    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
    while frame is not None and frame.f_code.co_filename.startswith("<frozen "):
        frame = frame.f_back
    return f"; it was at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""


def _register(found: Discovery, plugin: Plugin, name: object, backend: Backend) -> None:
    """Add one backend, or record why not (bad name, another's reserved name, a name taken)."""
    if not isinstance(name, str):
        problem = f"{plugin.label}: a backend's name is a {type(name).__name__}, expected a str"
    elif name == AUTO or not _VALID_NAME.fullmatch(name):
        problem = f"{plugin.label}: backend name {name!r} is not a name (letters, digits, _ - .; not 'auto')"
    elif not plugin.may_use(name):
        problem = f"{plugin.label}: backend name {name!r} is reserved for {hookspecs.RESERVED[name]}"
    elif name in found.backends:
        problem = f"{plugin.label}: backend name {name!r} is already registered by {found.backends[name].plugin.label}"
    else:
        found.backends[name] = Loaded(backend, plugin)
        return
    found.problems.append(Problem(plugin, problem))
