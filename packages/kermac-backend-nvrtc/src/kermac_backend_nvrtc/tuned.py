"""NVRTC backends of other tuning, registered in process beside the installed backends (A/B work).

kermac's operations take a backend by name, and backends come from plugins
([`kermac.hookspecs`][kermac.hookspecs]).  `registered` makes the given
`NvrtcBackend` objects a plugin of this process for the
duration of a `with` block: discovery runs again over the installed entry points plus one
in-process entry point that provides them (`kermac.registry.reset`), and once more without it at
the end:

```text
from kermac_backend_nvrtc import NvrtcBackend, NvrtcTuning
from kermac_backend_nvrtc.tuned import registered

with registered(NvrtcBackend(NvrtcTuning(tensor_cores=False), name="nvrtc-simt")):
    kermac.cdist(x, z, backend="nvrtc-simt")   # the SIMT kernels
    kermac.cdist(x, z, backend="nvrtc")        # the installed backend, default tuning
```

A backend named `nvrtc` takes the installed one's place inside the block.  Registration is
process-wide (the registry is): do not use it while other threads call kermac.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import metadata

from kermac import hookspecs, registry
from kermac.hookspecs import hookimpl
from kermac_backend_nvrtc.backend import NvrtcBackend

__all__ = ["registered"]


class _Plugin:
    """The in-process plugin: the backends of the innermost `registered` block."""

    def __init__(self) -> None:
        self.backends: list[NvrtcBackend] = []

    @hookimpl
    def kermac_backends(self) -> list[NvrtcBackend]:
        return list(self.backends)


PLUGIN = _Plugin()
_ENTRY_POINT = "kermac-backend-nvrtc-tuned"


@contextlib.contextmanager
def registered(*backends: NvrtcBackend) -> Iterator[None]:
    """Inside the block, `backend=<name>` runs the given backends (the installed ones run too,
    but for one named like a given one); the installed set is back afterwards.  Blocks do not nest."""
    for i, b in enumerate(backends):
        if not isinstance(b, NvrtcBackend):
            raise TypeError(f"backends[{i}]: expected a kermac_backend_nvrtc.NvrtcBackend, got {type(b).__name__}")
    names = [b.name for b in backends]
    if len(set(names)) != len(names):
        raise ValueError(f"backends: expected distinct names, got {names}")
    if PLUGIN.backends:
        raise RuntimeError("registered(): a block is already open (blocks do not nest)")
    group = hookspecs.ENTRY_POINT_GROUP
    installed = [ep for ep in metadata.entry_points(group=group) if ep.name not in names]
    own = metadata.EntryPoint(_ENTRY_POINT, f"{__name__}:PLUGIN", group)
    PLUGIN.backends = list(backends)
    try:
        registry.reset([own, *installed])
        yield
    finally:
        PLUGIN.backends = []
        registry.reset()
