"""Kernel variants: one frozen type per kernel family, holding what changes that family's source.

Every variant holds the program, which hyperparameters are tensors (pointer + batch strides; the
others are numbers, kernel arguments, so a new value needs no recompile), the number of coalesced
batch dimensions, and the half-power facts (`KernelVariant`).  Each family adds only its own
fields, so a combination no kernel implements cannot be built:

- `SimtPairwise` (`cuda/simt_pairwise.cuh`): every pairwise program;
- `SplitPowerPairwise` (the same with `cuda/pow_split.cuh`): float `Σ |x − z|^p`, p >= 1;
- `KContiguousPairwise` (the same with `cuda/kcontig_loop.cuh`): float32 `Σ |x − z|`, row-major x;
- `MmaPairwise` (`cuda/mma_pairwise.cuh`): float32 `Σ (x − z)²`;
- `WgmmaPairwise` (`cuda/wgmma_pairwise.cuh`, sm_90a): float32 `Σ (x − z)²` on sm_90;
- `SimtGrad` (`cuda/simt_grad.cuh`): every gradient program, in the product or the general form;
- `MmaGrad` (`cuda/mma_grad.cuh`): float32 gradients in the product form with O >= 5;
- `SignGrad` (`cuda/sign_grad.cuh`, sm_90a): float32 gradients of the factor `sign(d − b)` on sm_90;
- `SimtProduct` (`cuda/simt_product.cuh`): the fused kernel product K @ v of every pairwise program.

Sizes, strides, pointers and hyperparameter values are kernel arguments, not variant fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from kermac_backend_nvrtc import tiles

__all__ = [
    "INPUT_TYPES",
    "Ex2Polynomial",
    "KContiguousPairwise",
    "KernelVariant",
    "LoadMode",
    "MmaGrad",
    "MmaPairwise",
    "PowerTable",
    "SignGrad",
    "SimtGrad",
    "SimtPairwise",
    "SimtProduct",
    "SplitPowerPairwise",
    "TileLoad",
    "WgmmaPairwise",
    "arch_capability",
]

INPUT_TYPES: dict[str, tuple[str, str]] = {
    "float32": ("float", "float"),
    "float64": ("double", "double"),
    "float16": ("km_f16", "float"),
    "bfloat16": ("km_bf16", "float"),
}
"""torch dtype name → (CUDA storage type, compute type)."""


class LoadMode(IntEnum):
    """How a block's threads load an operand tile of P positions (rows) × K features
    (`cuda/loader.cuh`'s `MODE`)."""

    SCALAR_K_FASTEST = 0  # one element per load, consecutive threads along k
    SCALAR_P_FASTEST = 1  # one element per load, consecutive threads along the positions
    VECTOR_ALONG_K = 2  # one vector of consecutive k of a position (unit k stride, aligned)
    VECTOR_ALONG_P = 3  # one vector of consecutive positions at one k (unit position stride, aligned)


@dataclass(frozen=True)
class TileLoad:
    """How one operand tile is loaded: the mode and the `count` of elements each thread loads (the
    vector length for the vector modes)."""

    mode: LoadMode
    count: int


@dataclass(frozen=True, kw_only=True)
class KernelVariant:
    """What every variant holds.

    `tensor_hypers`: (name, CUDA element type) of the hyperparameters given as tensors.
    `half_powers`: powers of |·| whose exponents are known multiples of 1/2 are products and a square
    root; `fixed_hypers`: the scalar hyperparameters whose values the source holds for that purpose.
    `hypers_at_least_one`: the scalar hyperparameters known finite and >= 1 (`|a|^h` then needs no
    `h = 0` case)."""

    program: object  # kermac.programs.PairwiseProgram or GradProgram
    tensor_hypers: tuple[tuple[str, str], ...]
    batch_dims: int
    hypers_at_least_one: frozenset[str] = frozenset()
    half_powers: bool = False
    fixed_hypers: tuple[tuple[str, float], ...] = ()

    kernel: ClassVar[str]
    """The kernel's name in its source."""
    sm90a_only: ClassVar[bool] = False
    """Whether the kernel uses sm_90's architecture-specific instructions (compiled for `sm_90a`)."""

    @property
    def compute(self) -> str:
        """The compute type: "float" or "double"."""
        return INPUT_TYPES[self.dtype][1]

    @property
    def dynamic_smem(self) -> int:
        """Bytes of dynamic shared memory a block takes (0: static only)."""
        return 0

    def target(self, capability: int) -> str:
        """NVRTC target on a device of `capability` (90 → `sm_90`; `sm_90a` where required)."""
        return "sm_90a" if self.sm90a_only else f"sm_{capability}"


# ---- pairwise ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SimtPairwise(KernelVariant):
    """The register-tiled SIMT pairwise kernel for any program and input type.

    `deep_k`: 16 k-values per staged tile instead of 8 (float programs whose inner term and
    epilogue are cheap).  `padded_tail`: every k tile, the partial one zero-padded, runs the
    unrolled loop with no branch to a tail loop — for programs whose term of two zero features is
    the reduction's identity.  `flush_subnormals`: powers with exponents known >= 1 skip the
    denormal fix-ups (terms below 2^-126 become 0).  `call_combine`: the reduction's combine is a called
    function instead of inlined (an expensive one, such as log-sum-exp's: faster compiles, see
    `NvrtcTuning.inline_expensive_combine`)."""

    dtype: str
    x: TileLoad
    z: TileLoad
    k_unroll: int
    deep_k: bool = False
    padded_tail: bool = False
    flush_subnormals: bool = False
    call_combine: bool = False

    kernel: ClassVar[str] = "kermac_pairwise"


@dataclass(frozen=True)
class Ex2Polynomial:
    """`pairs` of a thread's 64 pairs take |x − z|^p's ex2 as a polynomial on the FMA pipe."""

    pairs: int


@dataclass(frozen=True)
class PowerTable:
    """`pairs` of a thread's 64 pairs take |x − z|^p from a shared table of 2^(e·p) times a mantissa
    polynomial of `degree` (`pow_table`); the table flushes terms below 2^-126."""

    pairs: int
    degree: int


@dataclass(frozen=True, kw_only=True)
class SplitPowerPairwise(KernelVariant):
    """The SIMT pairwise kernel for a float (32- or 16-bit input) `Σ |x − z|^p` with p known finite
    and >= 1: part of each thread's pairs (`split`) skip the special-function unit, so both pipes
    work; the others, and every tile holding an input too large for the split, take lg2 and ex2."""

    dtype: str
    x: TileLoad
    z: TileLoad
    k_unroll: int
    split: Ex2Polynomial | PowerTable
    flush_subnormals: bool = False

    kernel: ClassVar[str] = "kermac_pairwise"


@dataclass(frozen=True, kw_only=True)
class KContiguousPairwise(KernelVariant):
    """The SIMT pairwise kernel on k-contiguous tiles filled by cp.async, for float32 `Σ |x − z|` with
    row-major aligned x and unit-stride z rows (`cuda/kcontig_loop.cuh`)."""

    dtype: ClassVar[str] = "float32"
    kernel: ClassVar[str] = "kermac_pairwise"


@dataclass(frozen=True, kw_only=True)
class MmaPairwise(KernelVariant):
    """float32 `Σ (x − z)²` as ‖x‖² + ‖z‖² − 2·x·z with the cross term in 3×TF32 on `mma.sync`.
    `call_epilogue`: the epilogue is a called function instead of inlined (faster compiles, slower
    kernel)."""

    x: TileLoad
    z: TileLoad
    call_epilogue: bool = False

    dtype: ClassVar[str] = "float32"
    kernel: ClassVar[str] = "kermac_pairwise"


@dataclass(frozen=True, kw_only=True)
class WgmmaPairwise(KernelVariant):
    """The same math as `MmaPairwise` on sm_90's warpgroup tensor cores (`wgmma`)."""

    x: TileLoad
    z: TileLoad
    call_epilogue: bool = False

    dtype: ClassVar[str] = "float32"
    kernel: ClassVar[str] = "kermac_pairwise"
    sm90a_only: ClassVar[bool] = True

    @property
    def dynamic_smem(self) -> int:
        return tiles.WGMMA_DYNAMIC_SMEM


# ---- fused kernel product ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SimtProduct(KernelVariant):
    """The fused kernel product `out = K @ v` for any pairwise program and input type: the SIMT
    pairwise main loop computes each tile of K (as `SimtPairwise` without its deep, padded or split
    forms), which is contracted with `v` in registers.  `v`: how v's tiles (BN rows × `cc` columns)
    load; `cc`: columns of out per block (a power of two; more columns take more blocks, each computing
    K again).  `call_combine` as in `SimtPairwise`."""

    dtype: str
    x: TileLoad
    z: TileLoad
    v: TileLoad
    k_unroll: int
    cc: int
    flush_subnormals: bool = False
    call_combine: bool = False

    kernel: ClassVar[str] = "kermac_product"


# ---- gradient ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SimtGrad(KernelVariant):
    """The SIMT gradient kernel for any program (product or general form) and input type: `ot` outputs
    per pair in registers.  `flush_subnormals`: signed powers with exponents known >= 0 flush subnormals.
    `call_combine` as in `SimtPairwise` (general programs only: the product form's combine is an FMA)."""

    dtype: str
    a: TileLoad
    b: TileLoad
    c: TileLoad
    ot: int
    k_unroll: int
    flush_subnormals: bool = False
    call_combine: bool = False

    kernel: ClassVar[str] = "kermac_grad"


@dataclass(frozen=True, kw_only=True)
class MmaGrad(KernelVariant):
    """The float32 gradient of a program in the product form (`kermac.programs.product_factor`) as a
    3×TF32 matrix product on `mma.sync`: `eights` groups of 8 outputs per block (1 or 2).
    `hypers_above_one`: scalar hyperparameters known finite and > 1 (the signed power then needs no
    zero case)."""

    a: TileLoad
    b: TileLoad
    c: TileLoad
    eights: int
    flush_subnormals: bool = False
    hypers_above_one: frozenset[str] = frozenset()

    dtype: ClassVar[str] = "float32"
    kernel: ClassVar[str] = "kermac_grad"

    @property
    def ot(self) -> int:
        """Outputs per block."""
        return 8 * self.eights

    @property
    def dynamic_smem(self) -> int:
        return tiles.tc_grad_dynamic_smem(self.ot)


@dataclass(frozen=True, kw_only=True)
class SignGrad(KernelVariant):
    """A float32 `sign(d − b)` gradient (p = 1) as a bf16 sign product on sm_90's warpgroup tensor
    cores: `eights` groups of 8 outputs per block (1 or 2).  The kernel copies its own tiles."""

    eights: int

    dtype: ClassVar[str] = "float32"
    kernel: ClassVar[str] = "kermac_grad"
    sm90a_only: ClassVar[bool] = True

    @property
    def ot(self) -> int:
        """Outputs per block."""
        return 8 * self.eights

    @property
    def dynamic_smem(self) -> int:
        return tiles.SIGN_GRAD_TILE.dynamic_smem(self.ot)


def arch_capability(arch: str) -> int:
    """Compute capability named by an NVRTC target as one number (`sm_90` and `sm_90a` → 90)."""
    return int(arch.removeprefix("sm_").rstrip("a"))
