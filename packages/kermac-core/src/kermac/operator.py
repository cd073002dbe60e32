r"""[`KernelOperator`][kermac.operator.KernelOperator]: a kernel matrix `K(x, z)` held as its inputs, never
materialised.

`K[*B, m, n] = program(x[*B, m, :], z[*B, n, :])` with the diagonal `m + offset_m == n + offset_n`
(regularisation `K + λI`).  `K @ v` is a fused product ([`kermac.ops.product`][kermac.ops.product]), `K.T`
the same operator with its operands exchanged ([`swap_operands`][kermac.programs.swap_operands]), slices
`K[a:b]` and `K[:, c:d]` slice `x` and `z` and shift the offsets, so every derived operator stays lazy
and its diagonal stays the global one.  Names follow `torch` and GPyTorch's `linear_operator`
(`shape`, `dtype`, `device`, `matmul`, `diagonal`, `to_dense`).
"""

from __future__ import annotations

import torch

from kermac import ops
from kermac.api import lower_kernel
from kermac.hyperparams import HyperValue, program_hypers
from kermac.logs import debug_enabled
from kermac.problem import check_tensor, product_problem
from kermac.programs import PairwiseProgram, program_from_key, swap_operands

__all__ = ["KernelOperator"]


class KernelOperator:
    """The kernel matrix `K(x, z)` of a descriptor, preset or pairwise program, as an operator.

    Args:
        kernel: a [`KernelDescriptor`][kermac.descriptor.KernelDescriptor], a preset name (as
            [`run_kernel`][kermac.api.run_kernel]) or a [`PairwiseProgram`][kermac.programs.PairwiseProgram].
        x: `[..., M, D]`.
        z: `[..., N, D]` of the same dtype and device (batch dimensions broadcast).
        p: the descriptor's `p`, as in [`run_kernel`][kermac.api.run_kernel].
        bandwidth: the descriptor's bandwidth, likewise.
        regularization: λ on the diagonal, likewise.
        offset_m: row offset of the diagonal `m + offset_m == n + offset_n`, as in
            [`run_kernel`][kermac.api.run_kernel].
        offset_n: column offset of the diagonal, likewise.
        backend: the backend of every product and pairwise pass (`"auto"` or a name).
        debug: as in [`cdist`][kermac.api.cdist].
        **hypers: the hyperparameters of a program `kernel`, each by its name (`p`, `bandwidth` and
            `regularization` above count too, where the program reads those names).

    Construction validates the operands, hyperparameters and batch shape as a product would (it allocates
    nothing but an empty `[..., M, 0]` result of that check) and keeps references to `x`, `z` and the
    hyperparameters: products read them when they run, so changing them in place changes the operator.
    Construct it outside a `torch.compile` region (the check reads memory layouts on the host); inside one,
    `K.matmul(v)`, `K.T`, slices and `K.diagonal()` trace into one graph.
    """

    __slots__ = ("_backend", "_debug", "_hypers", "_key", "_name", "_offsets", "_shape", "x", "z")

    def __init__(
        self,
        kernel: object,
        x: torch.Tensor,
        z: torch.Tensor,
        *,
        p: float | torch.Tensor | None = None,
        bandwidth: float | torch.Tensor | None = None,
        regularization: float | torch.Tensor | None = None,
        offset_m: int = 0,
        offset_n: int = 0,
        backend: str = "auto",
        debug: bool = False,
        **hypers: float | torch.Tensor,
    ) -> None:
        debug = debug_enabled(debug)
        x = check_tensor("x", x)
        if isinstance(kernel, PairwiseProgram):
            named = {"p": p, "bandwidth": bandwidth, "regularization": regularization}
            given = {k: v for k, v in named.items() if v is not None} | hypers
            key, hv, name = kernel.key(), program_hypers(kernel.hypers, given, x.device, debug), "program"
        else:
            if hypers:
                raise TypeError(
                    f"KernelOperator: unexpected keyword arguments {sorted(hypers)} (only a PairwiseProgram takes "
                    "its hyperparameters as keywords; a descriptor takes p, bandwidth and regularization)"
                )
            key, hv = lower_kernel(kernel, x, p, bandwidth, regularization, debug, what="kernel")
            name = kernel if isinstance(kernel, str) else kernel.key()
        shape = self._checked_shape(key, x, z, hv, (offset_m, offset_n))
        self._set(name, key, x, z, hv, (offset_m, offset_n), backend, debug, shape)

    @staticmethod
    def _checked_shape(
        key: str, x: torch.Tensor, z: object, hypers: dict[str, HyperValue], offsets: tuple[int, int]
    ) -> tuple[int, ...]:
        """`batch + (M, N)` of `K(x, z)`, after the checks a product runs (operands, hyperparameters, batch)."""
        empty = x.new_empty(()).expand(z.shape[:-1] + (0,)) if isinstance(z, torch.Tensor) else z
        check = product_problem(
            program_from_key(key), x, z, empty, out=None, hypers=hypers, offset_m=offsets[0], offset_n=offsets[1],
            fake=True,
        )  # fmt: skip
        return check.batch_shape + (x.shape[-2], z.shape[-2])

    def _set(
        self,
        name: str,
        key: str,
        x: torch.Tensor,
        z: torch.Tensor,
        hypers: dict[str, HyperValue],
        offsets: tuple[int, int],
        backend: str,
        debug: bool,
        shape: tuple[int, ...],
    ) -> None:
        self._name, self._key, self.x, self.z, self._hypers = name, key, x, z, hypers
        self._offsets, self._backend, self._debug, self._shape = offsets, backend, debug, torch.Size(shape)

    def _derived(
        self, key: str, x: torch.Tensor, z: torch.Tensor, offsets: tuple[int, int], shape: tuple[int, ...]
    ) -> KernelOperator:
        """An operator of this kind on views of its operands (a transpose or a slice): validated with this one,
        so nothing is checked again (a trace through `.T` and slices then sees no host-side checks)."""
        op = object.__new__(KernelOperator)
        op._set(self._name, key, x, z, self._hypers, offsets, self._backend, self._debug, shape)
        return op

    @property
    def shape(self) -> torch.Size:
        """`batch + (M, N)`, the batch the broadcast of `x`, `z` and tensor hyperparameters."""
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def offsets(self) -> tuple[int, int]:
        """`(offset_m, offset_n)` of the diagonal `m + offset_m == n + offset_n`."""
        return self._offsets

    @property
    def regularization(self) -> float | torch.Tensor | None:
        """λ of the diagonal as checked at construction: a float, a tensor (one value per batch entry), or
        `None` for an operator without regularisation."""
        h = self._hypers.get("regularization")
        if h is None:
            return None
        return h.scalar if h.tensor is None else h.tensor

    def kernel_on(self, x: torch.Tensor, z: torch.Tensor) -> KernelOperator:
        """The same kernel and hyperparameters on other points, `K(x, z)` `[..., M', N']`, without the diagonal
        term (regularisation belongs to a system `K + λI`, not to the kernel function), e.g. the blocks
        `K(X, X_S)` and `K(X_S, X_S)` of a Nyström preconditioner.  Validated as at construction."""
        x, z = check_tensor("x", x), check_tensor("z", z)
        offsets = (0, x.shape[-2])  # m + 0 == n + M' has no solution with m < M': no diagonal entry
        return self._derived(self._key, x, z, offsets, self._checked_shape(self._key, x, z, self._hypers, offsets))

    def to(self, dtype: torch.dtype) -> KernelOperator:
        """The same operator on `x` and `z` converted to `dtype` (copies, made once when `z` is `x`; this operator
        when it has that dtype already). Hyperparameters are kept as they are: kernels compute in the operands'
        dtype whatever the hyperparameters' dtype."""
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
        if dtype == self.dtype:
            return self
        x = self.x.to(dtype)
        z = x if self.z is self.x else self.z.to(dtype)
        return self._derived(self._key, x, z, self._offsets, self._shape)

    @property
    def T(self) -> KernelOperator:
        """`Kᵀ`, lazily: the swapped program on `(z, x)`, offsets exchanged."""
        swapped = swap_operands(program_from_key(self._key)).key()
        batch, (m, n) = self._shape[:-2], self._shape[-2:]
        return self._derived(swapped, self.z, self.x, self._offsets[::-1], batch + (n, m))

    mT = T  # torch's name for the transpose of the matrix dimensions

    def matmul(self, v: torch.Tensor) -> torch.Tensor:
        """`K @ v`: `v` `[N]` gives `[..., M]`, `v` `[..., N, C]` gives `[..., M, C]` (batches broadcast)."""
        v = check_tensor("v", v, min_dim=1)
        if v.dim() == 1:
            return self.matmul(v[:, None])[..., 0]
        m0, n0 = self._offsets
        return ops.product(
            self._key, self.x, self.z, v, self._hypers, offset_m=m0, offset_n=n0, backend=self._backend,
            debug=self._debug, op="KernelOperator.matmul",
        )  # fmt: skip

    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        return self.matmul(v)

    def __rmatmul__(self, u: torch.Tensor) -> torch.Tensor:
        """`u @ K = (Kᵀ @ uᵀ)ᵀ`: `u` `[M]` gives `[..., N]`, `u` `[..., C, M]` gives `[..., C, N]`."""
        u = check_tensor("u", u, min_dim=1)
        return self.T.matmul(u) if u.dim() == 1 else self.T.matmul(u.mT).mT

    def to_dense(self) -> torch.Tensor:
        """The kernel matrix `[*shape]` (one pairwise pass: only for sizes whose `M·N` fits)."""
        m0, n0 = self._offsets
        return ops.pairwise(
            self._key, self.x, self.z, self._hypers, offset_m=m0, offset_n=n0, backend=self._backend,
            debug=self._debug, op="KernelOperator.to_dense",
        )  # fmt: skip

    def diagonal(self) -> torch.Tensor:
        """`K[..., i, i]` for `i < min(M, N)`, `[..., min(M, N)]`, regularisation included.

        One pairwise pass on the paired rows `(x_i, z_i)` as a batch of 1 × 1 problems (`O(min(M, N)·D)`
        work and memory); entry `i` is on the diagonal exactly when `offset_m == offset_n`."""
        k = min(self._shape[-2], self._shape[-1])
        xs, zs = self.x[..., :k, None, :], self.z[..., :k, None, :]
        hypers = {
            name: h if h.tensor is None else HyperValue(name, None, h.tensor[..., None], h.given)
            for name, h in self._hypers.items()
        }  # a batch dimension is appended for the rows: tensors align with the original batch
        m0, n0 = self._offsets
        out = ops.pairwise(
            self._key, xs, zs, hypers, offset_m=m0, offset_n=n0, backend=self._backend, debug=self._debug,
            op="KernelOperator.diagonal",
        )  # fmt: skip
        return out[..., 0, 0]

    def __getitem__(self, key: object) -> KernelOperator:
        """`K[a:b]`, `K[:, c:d]`, `K[a:b, c:d]`: lazy row and column blocks (step 1); the offsets shift by
        the block's origin, so the diagonal (and its regularisation) stays that of the whole matrix."""
        if isinstance(key, tuple) and len(key) != 2:
            raise IndexError(f"key: expected a row slice or (row slice, column slice), got {len(key)} indices")
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        (r0, r1), (c0, c1) = self._range("rows", rows, self._shape[-2]), self._range("columns", cols, self._shape[-1])
        m0, n0 = self._offsets
        x, z = self.x[..., r0:r1, :], self.z[..., c0:c1, :]
        return self._derived(self._key, x, z, (m0 + r0, n0 + c0), self._shape[:-2] + (r1 - r0, c1 - c0))

    @staticmethod
    def _range(what: str, index: object, size: int) -> tuple[int, int]:
        if not isinstance(index, slice):
            raise TypeError(
                f"key: expected slices of {what} (a lazy block of the operator), got {type(index).__name__}; "
                "use to_dense() for single entries"
            )
        start, stop, step = index.indices(size)
        if step != 1:
            raise ValueError(f"key: expected a slice of {what} with step 1, got step {step}")
        return start, max(start, stop)

    def __repr__(self) -> str:
        m0, n0 = self._offsets
        offsets = f", offset_m={m0}, offset_n={n0}" if (m0, n0) != (0, 0) else ""
        return (
            f"KernelOperator({self._name!r}, shape={list(self._shape)}, dtype={self.dtype}, device={self.device}"
            f"{offsets}, backend={self._backend!r})"
        )
