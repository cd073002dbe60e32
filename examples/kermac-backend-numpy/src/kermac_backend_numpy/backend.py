"""The numpy backend: kermac's pairwise programs and their kernel products computed with NumPy, on CPU tensors.

For a [`PairwiseProblem`][kermac.problem.PairwiseProblem] it computes, block of rows by block of rows,

```text
acc[*B, m, n] = REDUCE_k inner(x = x[*B, m, k], z = z[*B, n, k])      (REDUCE: sum, max, min or logsumexp)
out[*B, m, n] = epilogue(acc, diag = [m + offset_m == n + offset_n])
```

and for a [`ProductProblem`][kermac.problem.ProductProblem] the kernel product, each block of rows of K
contracted with `v` as soon as it is computed (K is never held whole):

```text
out[*B, m, c] = Σ_n K[*B, m, n] · v[*B, n, c]
```

No copy of the inputs is made: `Tensor.numpy()` gives a NumPy view of the caller's memory with its
strides (broadcast batch dimensions have stride 0), and the result is written through a view of
`problem.out`, whatever its strides.  The temporaries are one block of the `[*B, rows, N, D]`
cube of inner terms, bounded by `BLOCK_ELEMENTS`, its reduction (the block of K) and, for a
product, the block's `[*B, rows, C]` of the result.

This module is imported by the plugin's hook during discovery, so it imports neither NumPy nor the
evaluator at load time: both load in the hooks that need them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from kermac.backend import Availability, Backend
from kermac.problem import GradProblem, PairwiseProblem, ProductProblem
from kermac.programs import REDUCTIONS

if TYPE_CHECKING:
    from collections.abc import Iterator

    import numpy as np

    from kermac.hyperparams import HyperValue

__all__ = ["BLOCK_ELEMENTS", "DTYPES", "NumpyBackend"]

DTYPES = (torch.float32, torch.float64)
"""The dtypes it computes, each in itself.  NumPy has no bfloat16, and computing float16 in float32 as
kermac specifies would need a converted copy of the inputs: both half types are refused."""

BLOCK_ELEMENTS = 1 << 22
"""Upper bound on the inner terms evaluated at once (batch × rows × N × D; 32 MiB in float64)."""


class NumpyBackend(Backend):
    """Pairwise programs and their kernel products on CPU float32/float64 tensors, evaluated with NumPy;
    refuses gradients.

    Priority −10: negative, so the backend is opt-in -- `auto` never picks it and `kermac bench`
    times it only when named.  With a priority above 0 it would take the CPU problems it accepts from
    the `torch` reference as soon as it is installed: an example should change no one's results
    by being installed, so it runs only where a user names it.
    """

    name = "numpy"
    priority = -10
    description = "example plugin: pairwise programs and kernel products with NumPy on the CPU; opt-in"

    def availability(self) -> Availability:
        try:
            import numpy
        except ImportError as exc:
            return Availability.no(f"numpy cannot be imported ({exc})")
        return Availability.yes(numpy.__version__)

    def check_pairwise(self, problem: PairwiseProblem) -> str | None:
        return _refusal(problem)

    def check_product(self, problem: ProductProblem) -> str | None:
        # The product evaluates the same kernel as the pairwise pass: the same problems run.
        return _refusal(problem)

    def check_grad(self, problem: GradProblem) -> str | None:
        return "the numpy backend implements pairwise programs only, not the gradient contraction"

    def grad(self, problem: GradProblem) -> None:
        # kermac calls a run hook only after its check accepted the problem, which check_grad never does.
        raise NotImplementedError(self.check_grad(problem))

    def pairwise(self, problem: PairwiseProblem) -> None:
        import numpy as np

        out = problem.out.detach().numpy()
        for m0, m1, k in _kernel_rows(problem):
            np.copyto(out[..., m0:m1, :], k)

    def product(self, problem: ProductProblem) -> None:
        import numpy as np

        v, out = problem.v.detach().numpy(), problem.out.detach().numpy()
        for m0, m1, k in _kernel_rows(problem):
            np.matmul(k, v, out=out[..., m0:m1, :])


def _refusal(problem: PairwiseProblem | ProductProblem) -> str | None:
    """Why the backend cannot evaluate the kernel of `problem` (None if it can)."""
    from kermac_backend_numpy.evaluate import REDUCE, unsupported_ops

    if problem.device.type != "cpu":
        return f"the numpy backend reads CPU tensors only, got tensors on {problem.device}"
    if problem.dtype not in DTYPES:
        return f"the numpy backend computes float32 and float64 only, got {problem.dtype}"
    program = problem.program
    if program.reduction not in REDUCE:
        return f"the numpy backend reduces with {', '.join(REDUCE)} only, got {program.reduction!r}"
    missing = unsupported_ops(program.inner, program.epilogue)
    if missing:
        return f"the numpy backend does not implement the IR operations {', '.join(missing)}"
    return None


def _kernel_rows(problem: PairwiseProblem | ProductProblem) -> Iterator[tuple[int, int, np.ndarray]]:
    """The kernel of `problem` by blocks of rows: `(m0, m1, K[*B, m0:m1, :])`, each block `[*B, m1 − m0, N]`
    (a broadcast view where the program does not depend on every dimension), evaluated when asked for."""
    import numpy as np

    from kermac_backend_numpy.evaluate import REDUCE, evaluate

    prog, batch = problem.program, problem.batch_shape
    x, z = (t.detach().numpy() for t in (problem.x, problem.z))
    dtype = x.dtype
    inner_env = _hypers(problem.hypers, dtype, 3)  # against [*B, rows, N, D]
    epi_env = _hypers(problem.hypers, dtype, 2)  # against [*B, rows, N]
    m, n, d = x.shape[-2], z.shape[-2], x.shape[-1]
    reduce = REDUCE[prog.reduction]
    rows_per_block = max(1, BLOCK_ELEMENTS // max(1, math.prod(batch) * n * max(d, 1)))
    cols = np.arange(n) + problem.offset_n
    for m0 in range(0, m, rows_per_block):
        m1 = min(m, m0 + rows_per_block)
        shape = batch + (m1 - m0, n)
        terms = evaluate(prog.inner, {"x": x[..., m0:m1, None, :], "z": z[..., None, :, :], **inner_env}, dtype)
        # `initial` is the reduction's identity, so D = 0 gives it.  NaN and infinite terms give their IEEE
        # results silently, as in `evaluate` (np.logaddexp warns on them otherwise).
        with np.errstate(all="ignore"):
            acc = reduce.reduce(np.broadcast_to(terms, shape + (d,)), axis=-1, initial=REDUCTIONS[prog.reduction])
        rows = np.arange(m0, m1) + problem.offset_m
        diag = (rows[:, None] == cols[None, :]).astype(dtype)
        value = evaluate(prog.epilogue, {"acc": acc, "diag": diag, **epi_env}, dtype)
        yield m0, m1, np.broadcast_to(value, shape)


def _hypers(hypers: dict[str, HyperValue], dtype: np.dtype, trailing: int) -> dict[str, np.ndarray]:
    """The hyperparameters as arrays of `dtype`: 0-d for numbers; for tensors (already broadcast to
    the batch shape) views with `trailing` unit dimensions appended, so they broadcast per batch entry."""
    import numpy as np

    env = {}
    for name, hv in hypers.items():
        if hv.tensor is None:
            env[name] = np.asarray(hv.scalar, dtype=dtype)
        else:
            value = hv.tensor.detach().numpy().astype(dtype, copy=False)
            env[name] = value[(..., *(None,) * trailing)]
    return env
