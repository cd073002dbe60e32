"""Tile shapes of the NVRTC kernels: read by the planner (grids, load modes) and by the source
builder (the kernels' `#define`s).  Module constants, so a benchmark can replace one (and then
clear the backend's memos with `NvrtcBackend.forget()`); they are not part of `plan.call_key`."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "DEEP_K_LOADS_AT",
    "KCONTIG_CONFIG",
    "PRODUCT_MAX_CC",
    "PRODUCT_TWO_BLOCK_CC",
    "SIGN_GRAD_TILE",
    "TC_CONFIG",
    "TC_GRAD_CONFIG",
    "WGMMA_DYNAMIC_SMEM",
    "GradConfig",
    "PairwiseConfig",
    "SignGradTile",
    "TcGradConfig",
    "grad_config",
    "pairwise_config",
    "product_config",
    "smem_stride",
    "tc_grad_dynamic_smem",
]


@dataclass(frozen=True)
class PairwiseConfig:
    """Tile shape of a pairwise kernel: block BM×BN, `tn` threads along n (256 / `tn` along m),
    each thread `gm` groups of `vm` rows × `gn` groups of `vn` columns (BM = gm·vm·256/tn,
    BN = gn·vn·tn), k tiles of `bk`, shared rows padded by `spad`."""

    bm: int
    bn: int
    bk: int
    vm: int
    vn: int
    spad: int
    min_blocks: int
    tn: int = 16
    gm: int = 2
    gn: int = 2


TC_CONFIG = PairwiseConfig(bm=128, bn=128, bk=16, vm=0, vn=0, spad=8, min_blocks=2)
"""Tile of the tensor-core pairwise kernels (`cuda/mma_pairwise.cuh`, `cuda/wgmma_pairwise.cuh`):
8 warps of 64×32 outputs; the k-major shared rows are padded by 8 floats so that the mma
fragments' loads hit 32 distinct banks (row stride 136 ≡ 8 mod 32).  `vm`/`vn` describe the
SIMT thread tile and do not apply.  The wgmma kernel is written for its 128 × 128 × 16 shape.
"""

DEEP_K_LOADS_AT = 4
"""Where a padded-tail loop over 16-deep k tiles (`SimtPairwise.padded_tail` with `deep_k`)
issues the next tile's loads: after this many of its 16 k steps.  Earlier or later placements
made ptxas spill at 128 registers; 8-deep padded loops load at the top.
"""

KCONTIG_CONFIG = PairwiseConfig(bm=128, bn=128, bk=16, vm=1, vn=1, spad=0, min_blocks=2, tn=8, gm=4, gn=16)
"""The tile of the k-contiguous kernel (`KContiguousPairwise`, `cuda/kcontig_loop.cuh`): 128 × 128
outputs, 16-deep k tiles, each thread 4 rows (32 apart) × 16 columns (8 apart).
"""


def pairwise_config(compute: str, deep_k: bool = False) -> PairwiseConfig:
    """The SIMT pairwise tile for `compute` ("float" or "double").

    `deep_k` (float only) stages 16 k-values per barrier instead of 8: faster where the inner term
    and the epilogue are cheap, slower where either is not.  Those others give each thread 4 × 16
    outputs (one group of rows, four of columns) instead of 8 × 8 (measurements in docs/dev/).
    """
    if compute == "double":
        return PairwiseConfig(bm=64, bn=64, bk=8, vm=2, vn=2, spad=2, min_blocks=2)
    if deep_k:
        return PairwiseConfig(bm=128, bn=128, bk=16, vm=4, vn=4, spad=4, min_blocks=2)
    return PairwiseConfig(bm=128, bn=128, bk=8, vm=4, vn=4, spad=4, min_blocks=2, tn=8, gm=1, gn=4)


PRODUCT_MAX_CC = {"float": 16, "double": 8}
"""Most columns of v (and out) one block of the fused product contracts, by compute type: a thread keeps
its rows × that many partial sums beside the K tile's registers (`product_config`)."""

PRODUCT_TWO_BLOCK_CC = 4
"""Up to this many columns per block, the fused product runs two blocks per SM (128 registers a
thread), as the pairwise kernel does; with more, one (up to 255).  Chosen by ptxas's report, not by
time: at 128 registers, 8 and 16 columns spilled 0.1 to 1.1 KB a thread (Gaussian, Laplace-L1,
Laplace-Lp on sm_80), 1 to 4 columns at most 72 bytes (docs/dev/nvrtc-product.md)."""


def product_config(compute: str, cc: int) -> PairwiseConfig:
    """The K tile of the fused SIMT product (`cuda/simt_product.cuh`) contracting `cc` columns per block:
    the SIMT pairwise tile of `compute` without the deep k tiles (the product's partial sums take the
    registers those need), at `PRODUCT_TWO_BLOCK_CC`'s blocks per SM."""
    return replace(pairwise_config(compute), min_blocks=2 if cc <= PRODUCT_TWO_BLOCK_CC else 1)


@dataclass(frozen=True)
class GradConfig:
    """Tile shape of the SIMT gradient kernel: block BNN×BMM pairs, thread TPN×TPM pairs, at most
    `max_ot` outputs per pair."""

    bmm: int
    bnn: int
    bk: int
    tpm: int
    tpn: int
    max_ot: int
    spad: int
    min_blocks: int


def grad_config(compute: str) -> GradConfig:
    """The SIMT gradient tile for `compute` ("float" or "double")."""
    if compute == "double":
        return GradConfig(bmm=32, bnn=32, bk=16, tpm=2, tpn=2, max_ot=8, spad=2, min_blocks=1)
    return GradConfig(bmm=64, bnn=32, bk=16, tpm=4, tpn=2, max_ot=16, spad=4, min_blocks=1)


@dataclass(frozen=True)
class TcGradConfig:
    """Tile of the tensor-core gradient kernel (`cuda/mma_grad.cuh`): `warps_n` × `warps_m` warps
    of `wn` n × `wm`·16 m pairs."""

    warps_n: int
    warps_m: int
    wn: int
    wm: int
    bk: int
    k_unroll: int
    min_blocks: int
    max_ot: int = 16
    k_group: int = 1  # 8-wide k steps per fresh mma accumulator (the products' partial sums)

    @property
    def bnn(self) -> int:
        """n per block."""
        return self.warps_n * self.wn

    @property
    def bmm(self) -> int:
        """m per block."""
        return self.warps_m * self.wm * 16


TC_GRAD_CONFIG = TcGradConfig(warps_n=2, warps_m=4, wn=4, wm=1, bk=32, k_unroll=1, min_blocks=2, k_group=2)
"""8 n × 64 m pairs per block (warps of 4 n × 16 m), k tiles of 32, two blocks per SM, two k steps
per partial sum: the fastest of the tiles measured (docs/dev/), at 128 registers with a few
bytes of spills.
"""


def smem_stride(p: int) -> int:
    """Row stride (floats, ≥ `p`, a multiple of 4) of a k-major shared tile whose fragment loads —
    8 consecutive p by 4 consecutive k per warp — hit 32 distinct banks (stride ≡ 8 or 24 mod 32)."""
    s = -(-p // 8) * 8
    while s % 32 not in (8, 24):
        s += 8
    return s


@dataclass(frozen=True)
class SignGradTile:
    """Tile of the bf16 sign-product gradient (`cuda/sign_grad.cuh`): `threads` per block (4
    warpgroups: 2 along n × 2 along m), `mb` m per block, `mw` per thread, `bnn` n per block,
    k tiles of `bk`; staged rows of `bs` floats (b) and `acs` (a and c), padded so the fragment
    loads are conflict-free."""

    threads: int = 512
    mb: int = 4
    mw: int = 2
    bnn: int = 128
    bk: int = 64
    bs: int = 72
    acs: int = 68

    def dynamic_smem(self, ot: int) -> int:
        """Bytes of dynamic shared memory of a block with `ot` outputs: W and b in two buffers each,
        a and c in two, and 256 bytes to align W to the swizzle's 256-byte period."""
        w = 2 * self.mb * (self.bk // 16) * 3 * ot * 32
        return w + 2 * self.bnn * self.bs * 4 + 2 * (self.mb + ot) * self.acs * 4 + 256


SIGN_GRAD_TILE = SignGradTile()

WGMMA_DYNAMIC_SMEM = max(2 * 4 * 128 * 64, 128 * 136 * 4) + 2 * 128 * 4 + 1024
"""Dynamic shared memory of one wgmma pairwise block (`cuda/wgmma_pairwise.cuh`): two stages of
4 × 128 × 64 bytes, reused for the 128 × 136 float output tile of the epilogue (the larger of the
two), the 2 × 128 row norms, and 1 KB to align the stages to the 1024-byte boundary the swizzle
pattern repeats on.
"""


def tc_grad_dynamic_smem(ot: int) -> int:
    """Bytes of dynamic shared memory of a tensor-core gradient block with `ot` outputs: two k tiles
    each of a, b, c_hi and c_lo, rows padded by `smem_stride` (tile `TC_GRAD_CONFIG`)."""
    cfg = TC_GRAD_CONFIG
    return 4 * 2 * cfg.bk * (smem_stride(cfg.bmm) + smem_stride(cfg.bnn) + 2 * smem_stride(ot))
