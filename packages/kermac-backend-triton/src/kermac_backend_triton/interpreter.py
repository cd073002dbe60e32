"""Whether Triton runs kernels in its CPU interpreter (`TRITON_INTERPRET=1`), as Triton itself decides.

`TRITON_INTERPRET` is Triton's switch: Triton reads it (through `triton.knobs`) when it
decorates a `@triton.jit` function and when it compiles one.  The backend asks Triton rather
than parsing the variable again, so the backend's choices (CPU tensors, tile configurations), the
kernels' compile-time choices (`kermac_backend_triton.kernel_math.native_float32`) and the
kind of function Triton created always agree.
"""

from __future__ import annotations

import os
import sys

__all__ = ["interpreting"]


_knobs: object = None  # triton.knobs once imported; False where it cannot be


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter; `False` where `triton.knobs` cannot be imported.

    Triton is asked on every call (the variable may change); the module is imported once, and not before Triton
    is imported or the variable set: until then Triton's answer is False, and asking would import it.
    """
    global _knobs
    if _knobs is None:
        if "triton" not in sys.modules and "TRITON_INTERPRET" not in os.environ:
            return False
        try:
            from triton import knobs
        except Exception:  # an unusable triton interprets nothing; availability() reports why
            knobs = False
        _knobs = knobs
    return bool(_knobs and _knobs.runtime.interpret)
