r"""[`ShardedKernelOperator`][kermac.distributed.ShardedKernelOperator]: a kernel matrix `K(x, z)` whose rows of
`x` and of `z` are sharded over the ranks of a `torch.distributed` process group, never materialised.

Rank `r` of `P` holds a contiguous shard `x_r` (`[M_r, D]`) of the rows of `x` and `z_r` (`[N_r, D]`) of
the rows of `z`; the global matrix is `K[m, n] = k(x_m, z_n) + λ [m = n]` of shape `[M, N]` with
`M = Σ M_r`, `N = Σ N_r`, the shards in rank order.  A vector `v` is sharded like `z` (`v_r` `[N_r, C]`),
and `K @ v` returns the rank's rows of the product:

$$
(K v)_r = \sum_{s=0}^{P-1} K(x_r, z_s)\, v_s ,\qquad
K(x_r, z_s)[m, n] = k(x_r[m], z_s[n]) + \lambda\,[m + X_r = n + Z_s]
$$

with `X_r` and `Z_s` the row offsets of the shards (the sums of the smaller ranks' sizes), so the
regularisation lies on the global diagonal.  `K.T @ u` with `u` sharded like `x` returns the rank's rows
of `Kᵀ u`, sharded like `z`.

**Communication.** Construction runs one `all_gather` of every rank's shard sizes, feature count, dtype
and device type (one host synchronisation, to read the table; every rank checks the table the same way,
so a bad shard on one rank raises on every rank instead of leaving the others waiting).  A product then
passes each rank's block `[z_s | v_s]` (`[N_s, D + C]`, packed into one message) once around a ring of
`torch.distributed` point-to-point sends and receives (`batch_isend_irecv`; NCCL on CUDA tensors, gloo
on CPU tensors, any backend `torch.distributed` offers): at step `t` rank `r` multiplies the block of
rank `(r − t) mod P` with [`KernelOperator`][kermac.operator.KernelOperator] while it sends that block to
rank `r + 1` and receives the next one from rank `r − 1`, so communication overlaps the fused product.
Nothing else synchronises with the host (gloo's waits are those of the collectives themselves).

**Memory.** Besides the output `[M_r, C]`: the packed own block, at most two blocks in flight
(`max_s N_s × (D + C)` each) and one partial product `[M_r, C]` per step — `O((M_r + max_s N_s)(D + C))`,
never `O(M · N)` and never the gathered `z`.  Partial products are summed in the compute dtype (float32
for half inputs).

**Gradients** with respect to `v`, `x_shard` and `z_shard` (the latter two where
[`kernel_product`][kermac.api.kernel_product] differentiates them) flow through the ring: the backward
passes the blocks `[z_s | v_s]` around once more for `∂L/∂x_r` and the blocks `[x_s | g_s]` (`g` the
upstream gradient) for `∂L/∂z_r` and `∂L/∂v_r = Σ_s K(x_s, z_r)ᵀ g_s`, each rank adding its own terms, so
no gradient has to be sent back.  The backward is not itself differentiable (first derivatives only).

Every rank must construct the operator with the same kernel and hyperparameters, and call products
(and backward passes) in the same order with `v` of the same number of columns `C`, as for any
collective; a rank that raises in a product before its ring (a `v` of the wrong shape) leaves its peers
waiting in theirs until the process group's timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from kermac.operator import KernelOperator
from kermac.problem import check_tensor, compute_dtype

__all__ = ["ShardedKernelOperator"]

NOT_INITIALISED = (
    "ShardedKernelOperator: torch.distributed is not initialised; call torch.distributed.init_process_group first"
)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The dtypes the shape table encodes (by index; any other dtype fails the local check first)."""

_DEVICE_TYPES = ("cpu", "cuda")
"""The device types the shape table encodes (by index; any other is encoded as their count)."""


@dataclass(frozen=True)
class _Shard:
    """One rank's entry of the shape table gathered at construction."""

    failed: bool
    m: int
    n: int
    features: int
    dtype: int
    device_type: int


def _offsets(sizes: Sequence[int]) -> tuple[int, ...]:
    """The row offset of each shard: the sum of the sizes before it."""
    return (0, *accumulate(sizes))[: len(sizes)]


class ShardedKernelOperator:
    """The kernel matrix `K(x, z)` of a descriptor, preset or pairwise program, with the rows of `x` and `z`
    sharded over the ranks of a process group.

    Args:
        kernel: as in [`KernelOperator`][kermac.operator.KernelOperator] (a descriptor, a preset name or a
            [`PairwiseProgram`][kermac.programs.PairwiseProgram]); the same on every rank.
        x_shard: this rank's rows of `x`, `[M_r, D]` (`M_r` may be 0).
        z_shard: this rank's rows of `z`, `[N_r, D]`, of the dtype and device of `x_shard`.
        group: the process group (`None`: the default group).  Its backend must move tensors of the shards'
            device (NCCL for CUDA tensors, gloo for CPU tensors).
        p: as in [`KernelOperator`][kermac.operator.KernelOperator].
        bandwidth: likewise (a number or a one-element tensor: the sharded operator holds one matrix).
        regularization: λ on the global diagonal `m = n` of `K`.
        backend: the kermac backend of every local product (`"auto"` or a name).
        debug: as in [`cdist`][kermac.api.cdist].
        **hypers: the hyperparameters of a program `kernel`, by name.

    Raises:
        RuntimeError: torch.distributed has no initialised process group (before any collective), or another
            rank rejected its shards.
        TypeError: a shard that is not a floating tensor, or dtypes that differ across ranks.
        ValueError: shards that are not 2-D, feature counts or device types that differ across ranks, a
            batched hyperparameter, CPU shards on an NCCL group, or anything
            [`KernelOperator`][kermac.operator.KernelOperator] refuses.

    Construction runs one `all_gather` of a six-integer table per rank on the group (the only collective
    outside products) and reads it on the host once; products run the ring described in
    [`kermac.distributed`][kermac.distributed].
    """

    __slots__ = (
        "_col_sizes", "_cols", "_group", "_make", "_peers", "_rank", "_row_sizes", "_rows", "_template", "_transposed",
    )  # fmt: skip

    def __init__(
        self,
        kernel: object,
        x_shard: torch.Tensor,
        z_shard: torch.Tensor,
        *,
        group: dist.ProcessGroup | None = None,
        p: float | torch.Tensor | None = None,
        bandwidth: float | torch.Tensor | None = None,
        regularization: float | torch.Tensor | None = None,
        backend: str = "auto",
        debug: bool = False,
        **hypers: float | torch.Tensor,
    ) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(NOT_INITIALISED)
        group = dist.group.WORLD if group is None else group
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError("group: expected a process group this process belongs to, got one it is not in")
        make = partial(
            KernelOperator, kernel, p=p, bandwidth=bandwidth, regularization=regularization, backend=backend,
            debug=debug, **hypers,
        )  # fmt: skip
        error: Exception | None = None
        nccl = dist.get_backend(group) == "nccl"
        try:
            template = _check_local(make, x_shard, z_shard, nccl)
        except (TypeError, ValueError) as exc:
            error = exc
        table = _gather_table(group, nccl, x_shard, z_shard, failed=error is not None)
        _check_table(table, rank, error)
        world = len(table)
        self._group, self._rank, self._make, self._transposed = group, rank, make, False
        self._rows, self._cols, self._template = x_shard, z_shard, template
        self._row_sizes, self._col_sizes = tuple(s.m for s in table), tuple(s.n for s in table)
        self._peers = (dist.get_global_rank(group, (rank + 1) % world), dist.get_global_rank(group, (rank - 1) % world))

    @property
    def shape(self) -> torch.Size:
        """`(M, N)`: the global shape, `M = Σ M_r`, `N = Σ N_r` (`(N, M)` for the transpose)."""
        return torch.Size((sum(self._row_sizes), sum(self._col_sizes)))

    @property
    def dtype(self) -> torch.dtype:
        return self._rows.dtype

    @property
    def device(self) -> torch.device:
        return self._rows.device

    @property
    def regularization(self) -> float | torch.Tensor | None:
        """λ on the global diagonal, as [`KernelOperator.regularization`][kermac.operator.KernelOperator.regularization]
        reports it (None without regularisation)."""
        return self._template.regularization

    @property
    def local_rows(self) -> torch.Tensor:
        """This rank's shard of the points of the rows: `x_shard` (`z_shard` for the transpose)."""
        return self._rows

    @property
    def local_columns(self) -> torch.Tensor:
        """This rank's shard of the points of the columns: `z_shard` (`x_shard` for the transpose)."""
        return self._cols

    def kernel_on(self, a: torch.Tensor, b: torch.Tensor) -> KernelOperator:
        """The kernel alone (no λ) on this rank's points `a`, `b`: a local
        [`KernelOperator`][kermac.operator.KernelOperator] (see
        [`KernelOperator.kernel_on`][kermac.operator.KernelOperator.kernel_on]); no communication."""
        return self._template.kernel_on(a, b)

    def to(self, dtype: torch.dtype) -> ShardedKernelOperator:
        """The same sharded operator with this rank's shards converted to `dtype` (copies, one when the row and
        column shards are the same tensor; this operator when it has that dtype).  Local: every rank must call
        it with the same dtype before the next product."""
        template = self._template.to(dtype)
        if template is self._template:
            return self
        op = self._copy()
        rows = self._rows.to(dtype)
        op._rows, op._cols = rows, rows if self._cols is self._rows else self._cols.to(dtype)
        op._template = template
        return op

    def _copy(self) -> ShardedKernelOperator:
        op = object.__new__(ShardedKernelOperator)
        for name in self.__slots__:
            setattr(op, name, getattr(self, name))
        return op

    @property
    def group(self) -> dist.ProcessGroup:
        """The process group the products communicate on."""
        return self._group

    @property
    def row_range(self) -> tuple[int, int]:
        """`(start, stop)`: the global rows of `K` this rank holds (those of its `x_shard`; of `z_shard` for
        the transpose), the rows of its part of `K @ v`."""
        start = _offsets(self._row_sizes)[self._rank]
        return start, start + self._row_sizes[self._rank]

    @property
    def column_range(self) -> tuple[int, int]:
        """`(start, stop)`: the global columns of `K` whose rows of `v` this rank holds (those of its
        `z_shard`; of `x_shard` for the transpose)."""
        start = _offsets(self._col_sizes)[self._rank]
        return start, start + self._col_sizes[self._rank]

    @property
    def T(self) -> ShardedKernelOperator:
        """`Kᵀ`, sharded like `K` with rows and columns exchanged: `K.T @ u` takes `u` sharded like `x`."""
        op = self._copy()
        op._transposed, op._template = not self._transposed, self._template.T
        op._rows, op._cols = self._cols, self._rows
        op._row_sizes, op._col_sizes = self._col_sizes, self._row_sizes
        return op

    mT = T  # torch's name for the transpose of the matrix dimensions

    def matmul(self, v: torch.Tensor) -> torch.Tensor:
        """This rank's rows of `K @ v`: `v` is this rank's shard of the rows of `v`, `[N_r, C]` (or `[N_r]`),
        and the result `[M_r, C]` (or `[M_r]`); every rank calls it, with the same `C`."""
        n = self._col_sizes[self._rank]
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"v: expected a torch.Tensor, got {type(v).__name__}")
        if v.dtype != self.dtype:
            raise TypeError(f"v: expected dtype {self.dtype} (the dtype of the shards), got {v.dtype}")
        if v.device != self.device:
            raise ValueError(f"v: expected a tensor on {self.device} (the device of the shards), got {v.device}")
        if v.dim() not in (1, 2) or v.shape[0] != n:
            raise ValueError(
                f"v: expected shape [{n}, C] or [{n}] (this rank's {n} rows of the {self.shape[1]} columns of K), "
                f"got shape {list(v.shape)}"
            )
        if v.dim() == 1:
            return self.matmul(v[:, None])[:, 0]
        return _RingProduct.apply(self, self._rows, self._cols, v)

    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        return self.matmul(v)

    def __repr__(self) -> str:
        return (
            f"ShardedKernelOperator(shape={list(self.shape)}, rows={list(self.row_range)}, "
            f"columns={list(self.column_range)}, rank={self._rank}, world={len(self._row_sizes)}, "
            f"dtype={self.dtype}, device={self.device})"
        )

    def _local(self, rows: torch.Tensor, cols: torch.Tensor, row_shard: int, col_shard: int) -> KernelOperator:
        """The block of the global operator with the rows of shard `row_shard` and the columns of shard
        `col_shard`, its diagonal offsets those of the blocks' origin."""
        m0, n0 = _offsets(self._row_sizes)[row_shard], _offsets(self._col_sizes)[col_shard]
        if self._transposed:
            return self._make(cols, rows, offset_m=n0, offset_n=m0).T
        return self._make(rows, cols, offset_m=m0, offset_n=n0)

    def _ring(self, owns: Sequence[torch.Tensor], sizes: Sequence[tuple[int, ...]], step: Callable) -> None:
        """Pass each of this rank's blocks `owns[i]` (`[sizes[i][rank], W_i]`) once around the ring.

        At step `t` the rank holds the blocks of rank `s = (rank − t) mod P` and calls `step(s, blocks)`
        while the blocks go to the next rank and those of rank `s − 1` arrive from the previous one.
        Empty blocks are not sent (both ends know their sizes from the table)."""
        world, (following, preceding) = len(self._row_sizes), self._peers
        blocks = list(owns)
        for t in range(world):
            source = (self._rank - t) % world
            works, incoming = [], []
            if t + 1 < world:
                ops = []
                for block, size in zip(blocks, sizes, strict=True):
                    incoming.append(block.new_empty((size[(source - 1) % world], block.shape[1])))
                    if block.numel():
                        ops.append(dist.P2POp(dist.isend, block, following, self._group))
                    if incoming[-1].numel():
                        ops.append(dist.P2POp(dist.irecv, incoming[-1], preceding, self._group))
                works = dist.batch_isend_irecv(ops) if ops else []
            try:
                step(source, blocks)
            finally:  # every rank posted the matching operations: waiting cannot block on a failed peer
                for work in works:
                    work.wait()
            blocks = incoming

    def _forward(self, rows: torch.Tensor, cols: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """This rank's rows of `K @ v` (the ring of the blocks `[cols_s | v_s]`)."""
        features, total = cols.shape[1], _Sum(compute_dtype(v.dtype))

        def step(source: int, blocks: list[torch.Tensor]) -> None:
            (block,) = blocks
            total.add(self._local(rows, block[:, :features], self._rank, source) @ block[:, features:])

        self._ring([torch.cat([cols, v], dim=1)], [self._col_sizes], step)
        return total.value(v.dtype)

    def _backward(
        self, rows: torch.Tensor, cols: torch.Tensor, v: torch.Tensor, g: torch.Tensor, needs: tuple[bool, ...]
    ) -> tuple[torch.Tensor | None, ...]:
        """`(∂L/∂rows, ∂L/∂cols, ∂L/∂v)` of this rank (None where not needed) for the upstream gradient `g`.

        `∂L/∂rows` sums over the blocks `[cols_s | v_s]`; `∂L/∂cols` and `∂L/∂v` over the blocks
        `[rows_s | g_s]` (the rank's own columns against every rank's rows): one ring carries both."""
        need_rows, need_cols, need_v = needs
        features, dtype = rows.shape[1], compute_dtype(v.dtype)
        sums = [_Sum(dtype) if need else None for need in needs]
        owns, sizes = [], []
        if need_rows:
            owns.append(torch.cat([cols, v], dim=1))
            sizes.append(self._col_sizes)
        if need_cols or need_v:
            owns.append(torch.cat([rows, g], dim=1))
            sizes.append(self._row_sizes)

        def step(source: int, blocks: list[torch.Tensor]) -> None:
            blocks = list(blocks)
            if need_rows:
                block = blocks.pop(0)
                with torch.enable_grad():
                    r = rows.detach().requires_grad_()
                    y = self._local(r, block[:, :features], self._rank, source) @ block[:, features:]
                    sums[0].add(*torch.autograd.grad(y, r, g))
            if need_cols or need_v:
                (block,) = blocks
                rows_s, g_s = block[:, :features], block[:, features:]
                if not need_cols:  # ∂L/∂v alone is one transposed product
                    sums[2].add(self._local(rows_s, cols, source, self._rank).T @ g_s)
                    return
                with torch.enable_grad():
                    c, w = cols.detach().requires_grad_(), v.detach().requires_grad_(need_v)
                    y = self._local(rows_s, c, source, self._rank) @ w
                    grads = torch.autograd.grad(y, [c, w] if need_v else [c], g_s)
                for total, grad in zip(sums[1:], grads, strict=False):
                    total.add(grad)

        self._ring(owns, sizes, step)
        return tuple(None if total is None else total.value(v.dtype) for total in sums)


class _Sum:
    """A sum of partial results in `dtype` (the first partial is kept, not copied, when it has that dtype)."""

    __slots__ = ("_dtype", "_total")

    def __init__(self, dtype: torch.dtype) -> None:
        self._dtype, self._total = dtype, None

    def add(self, part: torch.Tensor) -> None:
        self._total = part.to(self._dtype) if self._total is None else self._total.add_(part)

    def value(self, dtype: torch.dtype) -> torch.Tensor:
        return self._total.to(dtype)


class _RingProduct(torch.autograd.Function):
    """`K @ v` on this rank's shards, differentiable in the shards and `v` through the ring."""

    @staticmethod
    def forward(
        ctx, op: ShardedKernelOperator, rows: torch.Tensor, cols: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        ctx.op = op
        ctx.save_for_backward(rows, cols, v)
        return op._forward(rows, cols, v)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows, cols, v = ctx.saved_tensors
        return (None, *ctx.op._backward(rows, cols, v, g, tuple(ctx.needs_input_grad[1:])))


def _check_local(make: Callable[..., KernelOperator], x: object, z: object, nccl: bool) -> KernelOperator:
    """This rank's shards: what [`KernelOperator`][kermac.operator.KernelOperator] accepts, 2-D, one matrix
    (no batched hyperparameter), and CUDA tensors on an NCCL group.  Returns the local operator `K(x, z)`
    (without the global diagonal offsets: it serves for λ and for the kernel on other points)."""
    for name, t in (("x_shard", x), ("z_shard", z)):
        if check_tensor(name, t).dim() != 2:
            raise ValueError(f"{name}: expected a 2-D shard [rows, D], got shape {list(t.shape)}")
    local = make(x, z)
    if len(local.shape) != 2:
        raise ValueError(
            f"ShardedKernelOperator: expected hyperparameters of one matrix (numbers or one-element tensors), "
            f"got a batch of {list(local.shape[:-2])} matrices"
        )
    if nccl and not x.is_cuda:
        raise ValueError(f"x_shard: expected a CUDA tensor (the process group's backend is NCCL), got {x.device}")
    return local


def _gather_table(group: dist.ProcessGroup, nccl: bool, x: object, z: object, *, failed: bool) -> list[_Shard]:
    """Every rank's `_Shard`, by one `all_gather` (on a CUDA device for an NCCL group, else on the CPU)."""
    if nccl:
        device = x.device if isinstance(x, torch.Tensor) and x.is_cuda else torch.device("cuda")
    else:
        device = torch.device("cpu")
    row = [1, 0, 0, 0, 0, 0]
    if not failed:
        kind = x.device.type
        row = [0, x.shape[0], z.shape[0], x.shape[1], _DTYPES.index(x.dtype)]
        row.append(_DEVICE_TYPES.index(kind) if kind in _DEVICE_TYPES else len(_DEVICE_TYPES))
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, mine, group=group)
    return [_Shard(bool(f), m, n, d, t, k) for f, m, n, d, t, k in torch.stack(rows).tolist()]


def _check_table(table: list[_Shard], rank: int, error: Exception | None) -> None:
    """The same decision on every rank: this rank's own error first, then another rank's, then features,
    dtypes and device types that differ across ranks."""
    if error is not None:
        raise error
    failed = [r for r, s in enumerate(table) if s.failed]
    if failed:
        raise RuntimeError(
            f"ShardedKernelOperator: rank(s) {failed} of the process group rejected their shards (their error "
            "names the argument); this rank's shards were not checked against theirs"
        )
    if len({s.features for s in table}) > 1:
        raise ValueError(
            f"x_shard: expected the same number of features D on every rank, got D = "
            f"{[s.features for s in table]} on ranks 0..{len(table) - 1} (this is rank {rank})"
        )
    if len({s.dtype for s in table}) > 1:
        raise TypeError(
            f"x_shard: expected the same dtype on every rank, got {[str(_DTYPES[s.dtype]) for s in table]} "
            f"on ranks 0..{len(table) - 1} (this is rank {rank})"
        )
    if len({s.device_type for s in table}) > 1:
        kinds = [(*_DEVICE_TYPES, "other")[s.device_type] for s in table]
        raise ValueError(
            f"x_shard: expected the same device type on every rank, got {kinds} on ranks 0..{len(table) - 1} "
            f"(this is rank {rank})"
        )
