"""`kermac.linalg`: the linear algebra of the `kermac-linalg` package ([`kermac_linalg`][kermac_linalg]).

`import kermac.linalg`, `from kermac.linalg import solve` and `kermac.linalg.solve` all reach the
same module object as `import kermac_linalg`: this module replaces itself by it on import.
"""

import sys

try:
    import kermac_linalg
except ImportError as exc:
    raise ImportError(
        "kermac.linalg needs the kermac-linalg package: pip install kermac-linalg (docs/installation.md)",
        name=__name__,
    ) from exc

sys.modules[__name__] = kermac_linalg
