"""pluggy hook specifications: how a package adds backends to kermac.

A plugin is any importable object (usually a module) named by an entry point in the group
``kermac.backends``; it implements :func:`kermac_backends`::

    # pyproject.toml of a third-party package
    [project.entry-points."kermac.backends"]
    mybackend = "my_package.plugin"

    # my_package/plugin.py  (keep it light: import heavy modules lazily)
    from kermac.hookspecs import hookimpl

    @hookimpl
    def kermac_backends():
        from my_package.backend import MyBackend  # a kermac.backend.Backend subclass
        return [MyBackend()]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from kermac.backend import Backend

PROJECT = "kermac"
ENTRY_POINT_GROUP = "kermac.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def kermac_backends() -> list[Backend]:
    """Return the backends this plugin provides (instances of :class:`kermac.backend.Backend`)."""
