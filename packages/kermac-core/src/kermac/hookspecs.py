"""pluggy hook specifications: how a package adds backends to kermac.

A plugin is any importable object (usually a module) named by an entry point in the group
`kermac.backends`; it implements [`kermac_backends`][kermac.hookspecs.kermac_backends]:

```text
# pyproject.toml of a third-party package
[project.entry-points."kermac.backends"]
mybackend = "my_package.plugin"

# my_package/plugin.py  (keep it light: import heavy modules lazily)
from kermac.hookspecs import hookimpl

@hookimpl
def kermac_backends():
    from my_package.backend import MyBackend  # a kermac.backend.Backend subclass
    return [MyBackend()]
```

Rules kermac enforces when it discovers plugins ([`kermac.discovery`][kermac.discovery]); a plugin that breaks
one is reported (a `RuntimeWarning` and a row of `kermac info`) and skipped, never fatal:

* The names in [`RESERVED`][kermac.hookspecs.RESERVED] -- as entry-point names and as backend names -- belong to the
  distributions that ship kermac's own backends; no other distribution may use them.
* An entry-point name declared by two distributions is loaded from the first one on `sys.path`
  only; a backend name is registered once (the first plugin to provide it keeps it).
* Backend names are letters, digits, `_`, `-` and `.` (not `auto`): users type them as
  `backend=` and in comma-separated lists.
* Importing the plugin and calling [`kermac_backends`][kermac.hookspecs.kermac_backends] happen in a helper thread that
  kermac waits for at most `KERMAC_PLUGIN_LOAD_TIMEOUT` seconds (default 5; details in
  [`kermac.discovery`][kermac.discovery]); keep both light, do not call kermac from them (backends are being
  discovered: such a call raises), and leave what only the main thread may do (signal handlers)
  out of them.

The contract of [`kermac.backend.Backend`][kermac.backend.Backend] is versioned by defaults: an operation added to
kermac after a backend was written (the fused kernel product, `check_product` / `product`, and its gradient,
`check_product_grad` / `product_grad`) comes with a default that refuses it with a sentence, so an older
plugin keeps loading and `auto` passes it over for that operation only.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from kermac.backend import Backend

PROJECT = "kermac"
ENTRY_POINT_GROUP = "kermac.backends"

RESERVED = MappingProxyType(
    {"torch": "kermac-core", "nvrtc": "kermac-backend-nvrtc", "triton": "kermac-backend-triton"}
)
"""Built-in names (entry-point names and backend names alike) -> the distribution that owns them."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def kermac_backends() -> list[Backend]:
    """Return the backends this plugin provides (instances of [`kermac.backend.Backend`][kermac.backend.Backend])."""
