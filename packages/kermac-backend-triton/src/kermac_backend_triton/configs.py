"""Tile configurations: the small autotuning spaces and the shape buckets they are keyed on.

Triton's autotuner times every configuration the first time a key is seen and keeps the
fastest; the key here is a *bucket* of the problem shape (the bit lengths of the sizes), so
similar shapes share one decision and a new shape rarely re-tunes.  Each configuration is a
separate compilation, so the spaces stay small (compile time matters).  Under the interpreter a
single small configuration is used (no timing is possible there).  With
`TritonTuning` `autotune=False` every launch on a GPU takes
the default configuration (`DEFAULT_PAIRWISE`, `default_pairwise_tc`,
`DEFAULT_GLUON_PAIRWISE`, `DEFAULT_GRAD`, `DEFAULT_GENERAL_GRAD`, the first entry of `grad_affine_space`),
compiling one kernel per program instead of
one per configuration.

Pairwise meta-parameters (see `kermac_backend_triton.pairwise_simt`): `BK` features per
step; `MI × NI` outputs per thread; `MT × NT` threads (`MT·NT / 32` warps); `PF` chunks
loaded ahead; `GROUP_M`.
Tensor-core pairwise kernel (float32 p = 2 family): `BM × BN` outputs per program, `BK` per
step, from one of two spaces chosen by D (the autotuner prunes to it, so a program compiles
two configurations).
Gradient: `BN × BM` (n, m) pairs and `BO` outputs rows per program, `BK` per step; `BO` is chosen
from O (`grad_block_o`, and `general_grad_block_o` for the general form's kernel), not tuned; the affine
factor's kernel (`kermac_backend_triton.gradient_affine`) has one row of `o` per program and a space of its own
per compute type (`grad_affine_space`).
Kernel product (`kermac_backend_triton.product`): the K tile's meta-parameters as above, and
`BC` columns of `v` per program, chosen from C (`product_block_c`), not tuned; on the tensor
cores `BK` is chosen from D (`product_tc_block_k`).  One column (`BC` = 1) has spaces of its own
(`PRODUCT_COLUMN_SPACE`, `PRODUCT_TC_COLUMN_SPACE`), and so does the tensor-core product from split
workspaces (`PRODUCT_TC_SPLIT_SPACE`, both); the autotuner prunes to the launch's (`prune_product`).
Gradient product (`kermac_backend_triton.product_gradient`): `BM` rows of x and `BN` of z per step, `BK`
features per step of the pairwise sum, and `BD` output features per step, chosen from D
(`product_grad_block_d`), not tuned; beyond `PRODUCT_GRAD_MAX_BD` features (fewer for a weighted reduction in
float64, `PRODUCT_GRAD_WEIGHTED_F64_MAX_BD`) a program accumulates in `out` (`RMW`).
The spaces were chosen by sweeps on an H100 (the decision records in `docs/dev/`); each comment
says what each entry is for.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_GENERAL_GRAD",
    "DEFAULT_GLUON_PAIRWISE",
    "DEFAULT_GRAD",
    "DEFAULT_PAIRWISE",
    "GENERAL_GRAD_SPACE",
    "GLUON_FEW_FEATURES",
    "GLUON_PAIRWISE_SPACE",
    "GRAD_AFFINE_SPACE",
    "GRAD_AFFINE_SPACE_FLOAT64",
    "INTERPRET_GENERAL_GRAD",
    "INTERPRET_GRAD",
    "INTERPRET_GRAD_AFFINE",
    "INTERPRET_PAIRWISE",
    "INTERPRET_PAIRWISE_TC",
    "INTERPRET_PRODUCT",
    "INTERPRET_PRODUCT_GRAD",
    "INTERPRET_PRODUCT_TC",
    "PRODUCT_COLUMN_SPACE",
    "PRODUCT_GRAD_MAX_BD",
    "PRODUCT_GRAD_RMW_BD",
    "PRODUCT_GRAD_SPACE",
    "PRODUCT_GRAD_WEIGHTED_F64_MAX_BD",
    "PRODUCT_SPACE",
    "PRODUCT_TC_COLUMN_SPACE",
    "PRODUCT_TC_RESIDENT_D",
    "PRODUCT_TC_SPACE",
    "PRODUCT_TC_SPLIT_BK",
    "PRODUCT_TC_SPLIT_SPACE",
    "TC_MIN_D",
    "TC_SHORT_D",
    "bucket",
    "default_pairwise_tc",
    "general_grad_block_o",
    "general_grad_configs",
    "gluon_pairwise_configs",
    "grad_affine_configs",
    "grad_affine_space",
    "grad_block_o",
    "grad_configs",
    "launch_options",
    "pairwise_configs",
    "pairwise_tc_configs",
    "pairwise_tc_space",
    "product_block_c",
    "product_configs",
    "product_grad_block_d",
    "product_grad_configs",
    "product_space",
    "product_tc_block_k",
    "product_tc_configs",
    "prune_pairwise_tc",
    "prune_product",
]

PAIRWISE_SPACE: tuple[tuple[dict[str, int], int, int], ...] = (
    ({"BK": 8, "MI": 8, "NI": 8, "MT": 8, "NT": 16, "PF": 1, "GROUP_M": 8}, 4, 3),
    ({"BK": 4, "MI": 8, "NI": 8, "MT": 8, "NT": 16, "PF": 2, "GROUP_M": 8}, 4, 3),
    ({"BK": 4, "MI": 8, "NI": 8, "MT": 8, "NT": 16, "PF": 1, "GROUP_M": 8}, 4, 3),
    ({"BK": 8, "MI": 4, "NI": 4, "MT": 8, "NT": 16, "PF": 0, "GROUP_M": 8}, 4, 3),
)
"""(meta-parameters, num_warps, num_stages) of the pairwise kernel on a GPU.
`PF` is the prefetch depth in k chunks (0: none).  One entry per kind of problem that preferred
it in the sweep: BK 8 with PF 1 short D, BK 4 with PF 2 long D, BK 4 with PF 1 the Laplace
kernel, the 4×4 micro-tile without prefetch fractional p (its pow raises register pressure).
"""

TC_MIN_D = 16
"""Smallest reduction length D that takes the tensor-core kernel: from D = 16 on it beats the
SIMT kernel; below, one `tl.dot` step is mostly padding.
"""

PAIRWISE_TC_SPACE_LONG: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BM": 128, "BN": 128, "BK": 32, "GROUP_M": 8}, 8, 3, 128),
    ({"BM": 64, "BN": 64, "BK": 32, "GROUP_M": 8}, 4, 3, None),
)
"""Tensor-core pairwise spaces, (meta-parameters, num_warps, num_stages, maxnreg), one per range
of D; the first entry of each is the default.  `maxnreg` = 128 lets two 8-warp (or four
4-warp) programs share a multiprocessor; ptxas's spills then lie outside the k loop.  Kept from
a 16-configuration sweep: 128×128×32 at 8 warps won every row with D ≥ 64, the 64×64 tiles are
there for problems with few tiles; BK = 16 won at D = 16 and 32.
"""
PAIRWISE_TC_SPACE_SHORT: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BM": 128, "BN": 64, "BK": 16, "GROUP_M": 8}, 4, 4, 128),
    ({"BM": 128, "BN": 128, "BK": 16, "GROUP_M": 8}, 8, 4, 128),
)
TC_SHORT_D = 64
"""D below which `PAIRWISE_TC_SPACE_SHORT` applies (a bit-length boundary of the
autotuning key, so one key never spans both spaces).
"""
PAIRWISE_TC_SPACE = PAIRWISE_TC_SPACE_LONG + PAIRWISE_TC_SPACE_SHORT

GRAD_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BN": 8, "BM": 32, "BK": 32}, 8, 3, 128),
    ({"BN": 8, "BM": 32, "BK": 32}, 8, 3, None),
    ({"BN": 8, "BM": 32, "BK": 16}, 4, 4, None),
)
"""Gradient kernel space, (meta-parameters, num_warps, num_stages, maxnreg); `BO` is chosen
from O (`grad_block_o`), not tuned.  The tile's `w` operand stays in registers (the
A operand of the tensor-core product), so registers set the occupancy: at 8 warps
`maxnreg` = 128 lets two programs share a multiprocessor (ptxas for sm_90 allocates more
without the cap; with it, a few spills).
"""

GRAD_AFFINE_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BN": 128, "BM": 64, "BK": 32}, 8, 3, None),
    ({"BN": 64, "BM": 128, "BK": 32}, 8, 3, None),
    ({"BN": 64, "BM": 64, "BK": 32}, 4, 3, None),
    ({"BN": 16, "BM": 128, "BK": 32}, 4, 3, None),
)
"""The affine factor's gradient kernel in float32 (`kermac_backend_triton.gradient_affine`): a 3×TF32 matrix
product per row of `o`, `BN × BM` outputs and `BK` of the contraction per step (`BO` is 1); the first entry is the
default.  Each thread holds its part of the accumulator and of each step's part
(`kermac_backend_triton.gradient.contract`) besides the split operands, so registers bound the tiles: the entries
are the largest that compile without spills for sm_80 and sm_90 (128 × 128 spills at 8 warps; the register
counts are in docs/dev/triton-gradient-affine.md), and 16 rows of n for problems with few (N ≤ 16, the features
of a gradient in the points); their speed is to be measured.
"""
GRAD_AFFINE_SPACE_FLOAT64: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BN": 32, "BM": 64, "BK": 16}, 4, 3, None),
    ({"BN": 32, "BM": 32, "BK": 16}, 4, 3, None),
)
"""As `GRAD_AFFINE_SPACE`, in float64 (an `ieee` product, twice the registers per value): 64 × 64 spills."""

GENERAL_GRAD_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BN": 4, "BM": 32, "BK": 4}, 4, 2, None),
    ({"BN": 8, "BM": 32, "BK": 2}, 4, 2, None),
    ({"BN": 4, "BM": 64, "BK": 4}, 8, 2, None),
)
"""The general gradient kernel's space (`kermac_backend_triton.general_gradient`), as `GRAD_SPACE`; `BO` comes
from O (`general_grad_block_o`).  The kernel combines one term at a time, so each thread holds `BO` accumulators
per `(n, m)` pair it owns (Triton's default layouts give the `BN × BM` pairs to the threads of `num_warps` warps)
and `BK` only sets how many `k` steps are unrolled; the entries were chosen by register use without spills, their
speed not measured.  Every entry keeps `BN` ≥ 2 and `BM` ≥ 8 (the bound on the number of programs in
`kermac_backend_triton.launch`).
"""

GLUON_PAIRWISE_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BM": 128, "BN": 128, "BK": 8, "TM": 4, "GROUP_M": 8}, 8, 1, None),
    ({"BM": 64, "BN": 128, "BK": 8, "TM": 2, "GROUP_M": 8}, 4, 1, None),
    ({"BM": 128, "BN": 128, "BK": 8, "TM": 4, "GROUP_M": 8}, 8, 1, 128),
)
"""Gluon SIMT pairwise space (the GPU's kernel for programs off the tensor cores,
`kermac_backend_triton.gluon_pairwise`), (meta-parameters, num_warps, num_stages,
maxnreg); the first entry is the default.  `num_stages` is unused (the kernel pipelines by
hand).  Kept from an 8-configuration sweep: 128×128 with 4 × 16 outputs per thread won at
D ≥ 256, capped at 128 registers (two programs per multiprocessor) for Laplace-L1, 64×128 at
D = 32 and for fractional p; BK 4 and BK 16 were never best.
"""

GLUON_FEW_FEATURES = 8
"""Below this many features the Gluon pairwise kernel is launched with `FEW` (its last chunk's missing features
skipped, not masked; docs/dev/triton-gluon-tail.md): no configuration's `BK` is smaller, so such a D is one partial
chunk, and a power of two, so the autotuning `bucket` (D's bit length) tells D below it from D at or above it."""

DEFAULT_PAIRWISE = dict(PAIRWISE_SPACE[1][0], num_warps=PAIRWISE_SPACE[1][1], num_stages=PAIRWISE_SPACE[1][2])
"""Configurations used when autotuning is off (launch options included)."""

INTERPRET_PAIRWISE = {"BK": 8, "MI": 2, "NI": 2, "MT": 4, "NT": 4, "PF": 2, "GROUP_M": 2}
"""The interpreter's only configurations: small tiles so CPU tests stay fast."""
INTERPRET_PAIRWISE_TC = {"BM": 16, "BN": 16, "BK": 16, "GROUP_M": 2}
INTERPRET_GRAD = {"BN": 2, "BM": 8, "BK": 16}
INTERPRET_GENERAL_GRAD = {"BN": 4, "BM": 16, "BK": 4}
INTERPRET_GRAD_AFFINE = {"BN": 16, "BM": 16, "BK": 16}
INTERPRET_PRODUCT = {"BK": 8, "MI": 4, "NI": 4, "MT": 4, "NT": 4, "PF": 2}
"""16 × 16 K tiles, the smallest a `tl.dot` takes."""
INTERPRET_PRODUCT_TC = {"BM": 16, "BN": 16}
INTERPRET_PRODUCT_GRAD = {"BM": 8, "BN": 4, "BK": 4}
"""Tiles smaller than the test sizes, so the interpreter walks several row, column and feature steps."""

PRODUCT_GRAD_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BM": 64, "BN": 8, "BK": 4}, 8, 1, None),
    ({"BM": 64, "BN": 8, "BK": 8}, 8, 1, None),
    ({"BM": 64, "BN": 4, "BK": 4}, 4, 1, None),
)
"""Gradient product, (meta-parameters, num_warps, num_stages, maxnreg); the first entry is the default.  One
stage: the kernel has no `tl.dot` for Triton's pipeliner, and its read-modify-write of `out` must stay in
program order.  Each
thread holds its part of the `[BN, BM, BD]` slope tile and of the `[BK, BN, BM]` terms of the pairwise sum
beside the `BM × BD` accumulator (or, accumulating in `out`, `acc`, `e'` and `G` across the steps over the
features), so the tiles stay small.  Chosen by register use (`cuobjdump -res-usage` for
sm_90: Laplace-L1, Laplace-Lp, Gaussian and a user program at `BD` = 4 and 16 in registers and 8 accumulated
in `out`), not yet by time: with Triton 3.9 every entry builds without spilling (3.6 spills 8–16 bytes
outside the loops for some programs: docs/dev/triton-version-floor.md), the default with 40–110 registers
in float32 and 64–240 in float64; 32 × 16 tiles at 4 warps took 150–250 in float32, 128-row tiles spilled in float64.
"""

PRODUCT_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BK": 4, "MI": 4, "NI": 4, "MT": 8, "NT": 16, "PF": 1}, 4, 3, None),
    ({"BK": 4, "MI": 4, "NI": 4, "MT": 16, "NT": 16, "PF": 1}, 8, 3, None),
    ({"BK": 4, "MI": 8, "NI": 4, "MT": 8, "NT": 16, "PF": 1}, 4, 3, None),
)
"""Kernel product on SIMT K tiles, (meta-parameters, num_warps, num_stages, maxnreg); the first
entry is the default.  Chosen by register use (`cuobjdump -res-usage`), not yet by time: a 32 × 64
tile at 4 warps, a 64 × 64 one at 8 and at 4 (8 × 4 outputs per thread, more reuse of each loaded
feature), with `BK` = 4 — the `tl` tile holds a `[BK, MI, NI, MT, NT]` term per step, and beside
it sit the `BM × BC` accumulator and the dot's operand copies of the K tile.  The default builds
without spills on sm_80 and sm_90 for every `BC`; the others do for `BC` = 16 and spill on
sm_80 at `BC` = 64 (the autotuner weighs that); `BK` = 8 spills more (docs/dev/triton-product.md).
"""
PRODUCT_TC_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BM": 64, "BN": 64}, 4, 3, None),
    ({"BM": 128, "BN": 64}, 8, 3, None),
)
"""Kernel product on tensor-core K tiles (as `PRODUCT_SPACE`; `BK` comes from D,
`product_tc_block_k`), chosen by register use, not yet by time: 64 × 64 at 4 warps and
128 × 64 at 8 build without spills for `BC` = 16 on sm_80 and sm_90 with Triton 3.9 (3.6 spills
outside the k loop at 64 × 64 on sm_80: docs/dev/triton-version-floor.md).
"""


PRODUCT_COLUMN_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BK": 4, "MI": 4, "NI": 4, "MT": 8, "NT": 16, "PF": 1}, 4, 3, None),
    ({"BK": 4, "MI": 4, "NI": 4, "MT": 8, "NT": 16, "PF": 2}, 4, 3, None),
    ({"BK": 4, "MI": 8, "NI": 4, "MT": 8, "NT": 16, "PF": 1}, 4, 3, None),
)
"""Kernel product of one column (`BC` = 1) on SIMT K tiles: no dot operands; beside the `[BK, MI,
NI, MT, NT]` terms of a step sits an accumulator of the K tile's shape.  Chosen by register use
(sm_90, Laplace-L1, Gaussian, Matérn-5/2): 32 × 64 tiles at 4 warps take 110–133 registers (four
programs per multiprocessor), 64 × 64 ones 164–177; 64 × 128 tiles and `BK` = 8 took 143–255 and
spilled."""
PRODUCT_TC_COLUMN_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BM": 64, "BN": 64}, 4, 3, None),
    ({"BM": 128, "BN": 64}, 8, 3, None),
    ({"BM": 128, "BN": 128}, 8, 3, 128),
)
"""Kernel product of one column on tensor-core K tiles: 64 × 64 at 4 warps (226 registers on
sm_90), 128 × 64 at 8 (234), and 128 × 128 at 8 capped at 128 registers as the pairwise
tensor-core space does (two programs per multiprocessor)."""

PRODUCT_TC_SPLIT_SPACE: tuple[tuple[dict[str, int], int, int, int | None], ...] = (
    ({"BM": 64, "BN": 128}, 4, 2, None),
    ({"BM": 128, "BN": 128}, 8, 3, None),
    ({"BM": 128, "BN": 64}, 8, 2, None),
)
"""Kernel product on tensor-core K tiles from split workspaces (`kermac_backend_triton.operand_split`; float32,
D > `PRODUCT_TC_RESIDENT_D`, `BK` = `PRODUCT_TC_SPLIT_BK`), one column or several: the fastest three of a sweep of
64/128-row and -column tiles at 2 and 3 stages, `BK` 32 and 64, on an H200 (Gaussian, N = 10⁵, D = 128 and
N = 5·10⁴, D = 784, C = 1 and 16; docs/dev/triton-product-presplit.md).  The default, 64 × 128 at two stages,
needs 96 KB of shared memory for its operand stages (sm_80 has 164 KB); 128 × 128 at three needs 192 KB (sm_90's
227 KB; the autotuner drops a configuration that does not fit)."""
PRODUCT_TC_SPLIT_BK = 32
"""Features per step of the tensor-core product from split workspaces (64 took more shared memory than the
three stages of a 128 × 128 tile have)."""


def pairwise_tc_space(d: int) -> tuple[tuple[dict[str, int], int, int, int | None], ...]:
    """The tensor-core configurations for reduction length `d`."""
    return PAIRWISE_TC_SPACE_SHORT if d < TC_SHORT_D else PAIRWISE_TC_SPACE_LONG


def default_pairwise_tc(d: int) -> dict:
    """The tensor-core configuration used without autotuning, for reduction length `d`."""
    return launch_options(pairwise_tc_space(d)[0])


def _config(entry: tuple) -> object:
    import triton

    meta, warps, stages, maxnreg = entry
    return triton.Config(dict(meta), num_warps=warps, num_stages=stages, maxnreg=maxnreg)


def _entry(config: object) -> tuple:
    return (config.kwargs, config.num_warps, config.num_stages, config.maxnreg)


def pairwise_tc_configs() -> list:
    """Both tensor-core spaces as `triton.Config` objects (see `prune_pairwise_tc`)."""
    return [_config(entry) for entry in PAIRWISE_TC_SPACE]


def prune_pairwise_tc(configs: list, named_args: dict, **kwargs: object) -> list:
    """The autotuner's `early_config_prune`: keep the space of the launch's D (2 compilations, not 4)."""
    keep = pairwise_tc_space(int(named_args["D"]))
    return [c for c in configs if _entry(c) in keep]


def gluon_pairwise_configs() -> list:
    """The Gluon pairwise space as `triton.Config` objects."""
    return [_config(entry) for entry in GLUON_PAIRWISE_SPACE]


def pairwise_configs() -> list:
    """The pairwise space as `triton.Config` objects."""
    import triton

    return [triton.Config(dict(meta), num_warps=w, num_stages=s) for meta, w, s in PAIRWISE_SPACE]


def grad_configs() -> list:
    """The gradient space as `triton.Config` objects."""

    return [_config(entry) for entry in GRAD_SPACE]


def grad_affine_space(compute: str) -> tuple[tuple[dict[str, int], int, int, int | None], ...]:
    """The affine factor's gradient space for compute type `compute` (`"float32"` or `"float64"`)."""
    return GRAD_AFFINE_SPACE_FLOAT64 if compute == "float64" else GRAD_AFFINE_SPACE


def grad_affine_configs(compute: str) -> list:
    """The affine factor's gradient space for compute type `compute` as `triton.Config` objects."""
    return [_config(entry) for entry in grad_affine_space(compute)]


def general_grad_configs() -> list:
    """The general gradient space as `triton.Config` objects."""
    return [_config(entry) for entry in GENERAL_GRAD_SPACE]


def launch_options(entry: tuple) -> dict:
    """Meta-parameters and launch options of one space entry, as `run_pairwise(meta=…)` takes them."""
    meta, warps, stages, *rest = entry
    options = dict(meta, num_warps=warps, num_stages=stages)
    if rest and rest[0] is not None:
        options["maxnreg"] = rest[0]
    return options


DEFAULT_GRAD = launch_options(GRAD_SPACE[0])
"""The gradient configuration used when autotuning is off."""
DEFAULT_GENERAL_GRAD = launch_options(GENERAL_GRAD_SPACE[0])
"""The general gradient configuration used when autotuning is off."""
DEFAULT_GLUON_PAIRWISE = launch_options(GLUON_PAIRWISE_SPACE[0])
"""The Gluon pairwise configuration used when autotuning is off."""


def product_configs() -> list:
    """The kernel product's SIMT spaces (several columns and one) as `triton.Config` objects, each entry once (the
    autotuner times every entry it keeps, repeats included)."""
    return [_config(entry) for entry in _union(PRODUCT_SPACE, PRODUCT_COLUMN_SPACE)]


def product_tc_configs() -> list:
    """The kernel product's tensor-core spaces (several columns and one, from split workspaces) as `triton.Config`
    objects, each entry once."""
    return [_config(entry) for entry in _union(PRODUCT_TC_SPACE, PRODUCT_TC_COLUMN_SPACE, PRODUCT_TC_SPLIT_SPACE)]


def _union(*spaces: tuple) -> list:
    """The entries of `spaces` in order, each once."""
    seen: list = []
    for entry in (e for space in spaces for e in space):
        if entry not in seen:
            seen.append(entry)
    return seen


def product_space(
    tensor_cores: bool, block_c: int, presplit: bool = False
) -> tuple[tuple[dict[str, int], int, int, int | None], ...]:
    """The kernel product's space for K tiles of the tensor cores (or SIMT) and `block_c` columns per program;
    `presplit`: tensor-core K tiles from split workspaces."""
    if presplit:
        return PRODUCT_TC_SPLIT_SPACE
    if tensor_cores:
        return PRODUCT_TC_COLUMN_SPACE if block_c == 1 else PRODUCT_TC_SPACE
    return PRODUCT_COLUMN_SPACE if block_c == 1 else PRODUCT_SPACE


def prune_product(configs: list, named_args: dict, **kwargs: object) -> list:
    """The autotuner's `early_config_prune` for the product: keep the space of the launch's `BC` (and
    `PRESPLIT`)."""
    tensor_cores = "BM" in configs[0].kwargs
    keep = product_space(tensor_cores, int(kwargs["BC"]), bool(kwargs.get("PRESPLIT", False)))
    return [c for c in configs if _entry(c) in keep]


PRODUCT_TUNING_SIZE = 1 << 16
"""Rows of x and of z the kernel product's autotuner times its configurations on where M or N is larger
(`kermac_backend_triton.launch.product_tuning_args`): 2¹⁶ × 2¹⁶ pairs keep every SM busy with any tile of the
space, and a configuration's timing stays a few milliseconds where the whole problem's can take a second."""


def product_block_c(c: int) -> int:
    """Columns of `v` per program: 1 for one column, else the next power of two ≥ C, at least 16
    (`tl.dot`), at most 64 (beyond, the columns take several programs, each recomputing its K tiles)."""
    return 1 if c == 1 else grad_block_o(c)


def product_grad_configs() -> list:
    """The gradient product's space as `triton.Config` objects."""
    return [_config(entry) for entry in PRODUCT_GRAD_SPACE]


PRODUCT_GRAD_MAX_BD = 16
"""The most output features the gradient product holds in registers (each thread holds its part of a
`[BN, BM, BD]` tile); a larger D is accumulated in `out`, `PRODUCT_GRAD_RMW_BD` features per step."""
PRODUCT_GRAD_RMW_BD = 8
"""Features per step where the gradient product accumulates in `out`: `acc`, `e'` and `G` of the tile of z stay
live across the steps, and 16 features per step spilled in float64 (Laplace-Lp, sm_90)."""
PRODUCT_GRAD_WEIGHTED_F64_MAX_BD = 8
"""`PRODUCT_GRAD_MAX_BD` for a weighted reduction (every one but the sum: its weights are a second `[BN, BM, BD]`
tile beside the slopes) in float64: 16 features in registers spilled (the soft minimum with a batched γ, sm_90).
Beyond, `PRODUCT_GRAD_RMW_BD` features per step in `out` as for a sum (4 per step let ptxas trade registers for a
spill on sm_80, the l∞ distance)."""


def product_grad_block_d(d: int, compute: str, weighted: bool) -> tuple[int, bool]:
    """Output features per step of the gradient product, and whether it accumulates in `out` (`RMW`): the next
    power of two ≥ D up to the most it holds in registers (`PRODUCT_GRAD_MAX_BD`, `PRODUCT_GRAD_WEIGHTED_F64_MAX_BD`
    for a `weighted` reduction computed in float64), else `PRODUCT_GRAD_RMW_BD` and `RMW`."""
    most = PRODUCT_GRAD_WEIGHTED_F64_MAX_BD if weighted and compute == "float64" else PRODUCT_GRAD_MAX_BD
    return (1 << max(0, d - 1).bit_length(), False) if d <= most else (PRODUCT_GRAD_RMW_BD, True)


PRODUCT_TC_RESIDENT_D = 32
"""The most features for which the tensor-core product takes every feature in one step and keeps x's
split rows in registers across its N tiles (`kermac_backend_triton.product.tensor_core_product_tile`)."""


def product_tc_block_k(d: int) -> int:
    """Features per step of the tensor-core K tile: one step of 16 or 32 up to `PRODUCT_TC_RESIDENT_D`
    (x then stays in registers), beyond that 16 below `TC_SHORT_D`, else 32 (as the pairwise spaces, whose
    sweep preferred BK = 16 at D = 16 and 32)."""
    if d <= PRODUCT_TC_RESIDENT_D:
        return 16 if d <= 16 else 32
    return 16 if d < TC_SHORT_D else 32


def grad_block_o(o: int) -> int:
    """Rows of `o` per program: the next power of two ≥ O, at least 16 (`tl.dot`), at most 64."""
    return min(64, max(16, 1 << max(0, o - 1).bit_length()))


def general_grad_block_o(o: int) -> int:
    """Rows of `o` per program of the general gradient kernel: the next power of two ≥ O, at most 16 (no
    `tl.dot` sets a minimum; each row adds one accumulator per `(n, m)` pair to a thread's registers)."""
    return min(16, 1 << max(0, o - 1).bit_length())


def bucket(*sizes: int) -> int:
    """One integer naming the bit lengths of `sizes` (Python ints; the autotuning key)."""
    key = 0
    for s in sizes:
        key = key * 64 + min(63, s.bit_length())
    return key
