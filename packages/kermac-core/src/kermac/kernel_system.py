r"""[`KernelSystem`][kermac.kernel_system.KernelSystem]: a square regularised kernel system `(K + λI) α = y` as the
solvers and preconditioners see it, on one device or with its rows sharded over the ranks of a process group.

Conjugate gradient and the preconditioners need six things of a system besides its products: λ, the points `x` whose
kernel it is (this process's rows of them), the kernel without λ on other points, sums over the rows of a block of
vectors (`Σ_n t[n, c]`, over every rank's rows), sums of partial results over the ranks and the rows of `x` at a set
of global indices (every rank receiving all of them).  A [`KernelOperator`][kermac.operator.KernelOperator] holds
all its rows; a [`ShardedKernelOperator`][kermac.distributed.ShardedKernelOperator] holds the rows `row_range` of
`x` (and of `y`, `α` and every vector of the solve), and its sums and gathers are `all_reduce`s on its process
group, so every rank computes the same step sizes and takes the same decisions."""

from __future__ import annotations

import torch
import torch.distributed as dist

from kermac.distributed import ShardedKernelOperator
from kermac.operator import KernelOperator

__all__ = ["KernelSystem"]


class KernelSystem:
    """A square operator `K + λI` (`[..., N, N]`) with its row layout.

    Args:
        K: a square [`KernelOperator`][kermac.operator.KernelOperator] (`K(x, x)`, λ its `regularization`), or a
            square [`ShardedKernelOperator`][kermac.distributed.ShardedKernelOperator] built as
            `ShardedKernelOperator(kernel, x_shard, x_shard, ...)` (each rank's rows of `x` serve as its rows
            and its columns; a rank whose row and column shards differ in size is refused by
            [`kermac.solvers.solve`][kermac.solvers.solve] on every rank).

    Attributes:
        operator: `K`.
        n: `N`, the global number of rows.
        batch: the operator's batch shape (`()` for a sharded operator).
        points: this process's rows of `x`, `[..., N_local, D]`.
        group: the process group of a sharded operator, else None.
    """

    __slots__ = ("batch", "group", "n", "operator", "points")

    def __init__(self, K: KernelOperator | ShardedKernelOperator) -> None:
        self.operator = K
        self.n = K.shape[-1]
        if isinstance(K, ShardedKernelOperator):
            self.batch, self.group, self.points = torch.Size(), K.group, K.local_rows
        else:
            self.batch, self.group, self.points = K.shape[:-2], None, K.x

    @property
    def dtype(self) -> torch.dtype:
        return self.operator.dtype

    @property
    def device(self) -> torch.device:
        return self.operator.device

    @property
    def regularization(self) -> float | torch.Tensor:
        """λ (0 when the operator has none): a float, or a tensor `[..., 1, 1]` aligned with the batch."""
        lam = self.operator.regularization
        if lam is None:
            return 0.0
        if isinstance(lam, float):
            return lam
        return torch.broadcast_to(lam, self.batch)[..., None, None]

    def matmul(self, v: torch.Tensor) -> torch.Tensor:
        """This process's rows of `(K + λI) v`, `v` `[..., N_local, C]`."""
        return self.operator @ v

    __matmul__ = matmul

    def sum_ranks(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the ranks (in place, one `all_reduce`): the total of every rank's partial sums over
        its rows, e.g. `K_Sn r = Σ_r K(x_S, x_r) r_r`; unchanged on one device."""
        if self.group is not None:
            dist.all_reduce(t, group=self.group)
        return t

    def row_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`Σ_n t[..., n, c]` over the rows of every rank: `[..., C]` from `t [..., N_local, C]`."""
        return self.sum_ranks(t.sum(-2))

    def column_norm(self, t: torch.Tensor) -> torch.Tensor:
        """`‖t[..., :, c]‖₂` over the rows of every rank, `[..., C]`."""
        if self.group is None:
            return torch.linalg.vector_norm(t, dim=-2)
        return self.row_sum(t * t).sqrt()

    def kernel_on(self, a: torch.Tensor, b: torch.Tensor) -> KernelOperator:
        """The kernel alone (no λ) on local points, `K(a, b)`, a [`KernelOperator`][kermac.operator.KernelOperator]
        with the operator's kernel, hyperparameters and backend."""
        return self.operator.kernel_on(a, b)

    def random_points(self, count: int, seed: int) -> torch.Tensor:
        """`count` rows of the global points chosen by a random permutation seeded with `seed` (the same on every
        rank), on every rank: `[..., count, D]` ([`gather_points`][kermac.kernel_system.KernelSystem.gather_points])."""
        index = torch.randperm(self.n, generator=torch.Generator().manual_seed(seed))[:count]
        return self.gather_points(index.to(self.device))

    def gather_points(self, index: torch.Tensor) -> torch.Tensor:
        """The rows `x[..., index, :]` of the global points (`index` int64 `[m]`, the same on every rank), on
        every rank: `[..., m, D]`.  Sharded: each rank fills the rows it holds into zeros and one `all_reduce`
        sums them (a workspace of `m × D`)."""
        if self.group is None:
            return self.points[..., index, :]
        start, stop = self.operator.row_range
        rows = self.points.new_zeros((index.shape[0], self.points.shape[-1]))
        if stop > start:  # a rank without rows contributes zeros
            mine = (index >= start) & (index < stop)
            rows = torch.where(mine[:, None], self.points[torch.where(mine, index - start, 0)], rows)
        dist.all_reduce(rows, group=self.group)
        return rows

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """`t` as the group's first rank has it (in place; one `broadcast`), so that quantities computed
        redundantly on every rank are bit-identical; unchanged on one device."""
        if self.group is not None:
            dist.broadcast(t, src=dist.get_global_rank(self.group, 0), group=self.group)
        return t

    def any_rank(self, flags: torch.Tensor) -> torch.Tensor:
        """`flags` (an integer tensor) OR-ed — the maximum taken — over the ranks (unchanged on one device)."""
        if self.group is not None:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        return flags

    def to(self, dtype: torch.dtype) -> KernelSystem:
        """The same system with its points converted to `dtype` (a copy; this system where it has it)."""
        return self if dtype == self.dtype else KernelSystem(self.operator.to(dtype))
