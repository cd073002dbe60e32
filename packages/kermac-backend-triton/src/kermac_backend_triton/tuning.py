"""The Triton backend's tuning: which kernels run and whether launches autotune, as one frozen value.

`TritonBackend(tuning=TritonTuning(...))` gives a backend with other choices (A/B measurements,
tests of one kernel); the registered backend uses the defaults.  Nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["DEFAULT_TUNING", "TritonTuning"]


@dataclass(frozen=True)
class TritonTuning:
    """Choices of the Triton backend on a GPU (the interpreter always runs one small `tl` tile).

    `autotune`: time every tile configuration of a kernel the first time a shape bucket is seen
    (`kermac_backend_triton.configs`); off, every launch takes the default configuration,
    one compilation per program instead of one per configuration.
    `tensor_cores`: float32 (x − z)²-sum programs with D ≥ `TC_MIN_D` take the guarded
    tensor-core expansion (`kermac_backend_triton.pairwise_tensor_cores`); off, the SIMT
    difference kernel.
    `gluon`: float32 SIMT programs take the Gluon kernel
    (`kermac_backend_triton.gluon_pairwise`) where this Triton has it; off, the `tl` kernel.
    `grad_tensor_cores`: gradient programs whose product factor is `α·d + β·b`
    ([`kermac.programs.affine_factor`][kermac.programs.affine_factor]; the p = 2 gradient of `cdist`) take
    the matrix-product kernel (`kermac_backend_triton.gradient_affine`); off, the product form's kernel
    (`kermac_backend_triton.gradient`).
    """

    autotune: bool = True
    tensor_cores: bool = True
    gluon: bool = True
    grad_tensor_cores: bool = False

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, bool):
                raise TypeError(f"{field.name}: expected a bool, got {type(value).__name__} {value!r}")


DEFAULT_TUNING = TritonTuning()
"""The measured defaults: autotuned, tensor cores and Gluon where they apply; the gradient's matrix-product kernel
off until it is measured."""
