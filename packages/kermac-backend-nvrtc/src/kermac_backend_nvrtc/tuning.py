"""How the NVRTC planner chooses among kernels that compute the same thing: one frozen value.

Every field of `NvrtcTuning` selects between kernels for the same program, so changing
one changes speed, compile time or (`flush_subnormals`) how float32 subnormal terms are
treated, never what a program means.  The defaults are the measured choices.  A backend holds one
tuning (`NvrtcBackend(tuning=...)`) and passes it to the planner; nothing reads the
environment, so backends with different tuning run side by side in one process for an A/B
comparison (`docs/dev/nvrtc-tuning.md`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["DEFAULT_TUNING", "THREAD_PAIRS", "NvrtcTuning"]

THREAD_PAIRS = 64
"""Output pairs each thread of the SIMT pairwise kernels holds (8 × 8 or 4 × 16): the whole that
the `*_pairs` fields divide between the special-function unit and the FMA pipe.
"""

_PAIR_COUNTS = ("power_table_pairs", "power_table_pairs_high_p", "ex2_polynomial_pairs")
_MIN_OUTPUTS = ("tensor_core_grad_min_o", "sign_product_min_o")
_MIN_FEATURES = ("tensor_core_min_d", "sign_product_min_features")


@dataclass(frozen=True)
class NvrtcTuning:
    """The planner's choices among equivalent kernels (frozen and hashable: plans are keyed by it).

    `NvrtcTuning()` holds the defaults; `dataclasses.replace(tuning, field=value)` or
    `NvrtcTuning(field=value)` another setting.  Switches are `bool`, pair counts `int` in
    0 to `THREAD_PAIRS`, output counts `int` ≥ 1; anything else raises `TypeError` or
    `ValueError` naming the field.
    """

    tensor_cores: bool = True
    """Float32 sums of (x − z)² (cdist p = 2, Gaussian, Laplace-L2, Matérn, user programs of that
    shape) compute ‖x‖² + ‖z‖² − 2·x·z with the cross term on the tensor cores in 3×TF32 and a
    cancellation guard that recomputes doubtful tiles from differences; float32 gradients with at
    least `tensor_core_grad_min_o` outputs contract on the tensor cores too.  The matrix units
    do the bulk of the work that the SIMT kernels spend one FMA per term on.  False: the SIMT
    kernels everywhere."""

    wgmma: bool = True
    """On sm_90, the tensor-core pairwise programs use asynchronous warpgroup MMAs (a cubin for
    sm_90a, operands read from shared memory) instead of `mma.sync`, and float32 sign(d − b)
    gradients (p = 1) with at least `sign_product_min_o` outputs run as an exact bf16 sign
    product: wgmma keeps the tensor cores busier than `mma.sync` can on that architecture.
    Takes effect only with `tensor_cores`."""

    half_powers: bool = True
    """Powers of |·| (signed too) whose exponent a constant or a scalar hyperparameter makes a
    multiple of 1/2 in [1/2, 4] are products and at most one square root instead of lg2 and ex2
    on the special-function unit, which runs at 1/8 of the FMA rate.  A hyperparameter's value
    then goes into the source: one compiled kernel per value."""

    flush_subnormals: bool = True
    """In float32 with a known p ≥ 1, |t|^p and the gradient's sgn(t)·|t|^(p−1) use the flushing
    lg2/ex2 (`.ftz`): terms below 2^-126 become 0 and the kernels carry no denormal fix-up code.
    False keeps those terms exact, and with them the power table off (it flushes)."""

    power_table: bool = True
    """Float32 sums of |x − z|^p with a number p in [1, 5] take the power of
    `power_table_pairs` (`power_table_pairs_high_p`) pairs as 2^(e·p) from a shared table
    times a polynomial in the mantissa, on the FMA pipe only, instead of lg2 on the
    special-function unit and ex2 as a polynomial: no special-function operation at all on those
    pairs.  Needs `flush_subnormals`.  False: `ex2_polynomial_pairs` applies instead."""

    power_table_pairs: int = 38
    """Pairs of a thread's 64 that take the power table for 1 ≤ p ≤ 3 (a degree-5 polynomial, 11
    issue slots a term); the others keep lg2 and ex2 on the special-function unit.  The split
    lets the FMA pipe and the special-function unit finish together.  0: the ex2 polynomial
    instead."""

    power_table_pairs_high_p: int = 32
    """The same for 3 < p ≤ 5, whose degree-6 polynomial costs one issue slot more a term, so
    fewer table pairs balance the two pipes."""

    ex2_polynomial_pairs: int = 36
    """Pairs of a thread's 64 whose ex2 of |x − z|^p (float32, a number p ≥ 1) runs as a
    polynomial on the FMA pipe instead of the special-function unit, where the power table does
    not apply.  A special-function pair costs a warp 16 MUFU cycles and 5 issue slots, a
    polynomial pair 8 and 12: the split balances the MUFU against the issue slots, and the default
    is the measured optimum below the arithmetic balance point.  0 keeps every pair on the
    special-function unit."""

    inline_expensive_epilogue: bool = True
    """The tensor-core kernels inline an expensive epilogue (div, exp, sqrt, pow, log: IEEE code
    with slow paths, 64 copies per thread), which runs faster than a call.  False calls it as a
    function: ptxas has less code to schedule and compiles faster, the kernel runs slower."""

    inline_expensive_combine: bool = False
    """The SIMT kernels inline a reduction's expensive combine (log-sum-exp's exp and log), once per term
    and pair of a thread's tile: thousands of copies, which take ptxas over a second to schedule.  False (the
    default) calls it as a function: the kernel compiles several times faster and runs somewhat slower (the
    measurement: docs/dev/semiring-reductions.md)."""

    zero_padded_k_tail: bool = True
    """Float32 sums of |x − z| (cdist p = 1, Laplace-L1) whose operands load as 16-byte vectors
    run every k tile, the partial last one zero-padded (|0 − 0| adds nothing to the sum), on the
    unrolled loop, with no branch to a tail loop: one loop body lets ptxas place the next tile's
    loads inside the math.  Other programs keep the branch (their padding did not pay).  False:
    the branch everywhere."""

    k_contiguous_tiles: bool = True
    """Float32 sums of |x − z| whose x rows are 16-byte aligned with unit stride along k (D a
    multiple of 4) and whose z rows have unit stride fill k-contiguous shared-memory tiles by
    cp.async, z's pairs landing swapped so that no difference x − z reads two registers of one
    bank (register-bank conflicts cost FADD issue slots in the zero-padded loop).  Same sums in
    the same order: bit-identical results.  Takes precedence over `zero_padded_k_tail`."""

    tensor_core_min_d: int = 16
    """Smallest number of features D for which a pairwise program of `tensor_cores` runs on them.  Below,
    the output's write and the epilogue set the time and a tensor-core k step is mostly padding: the SIMT
    kernel was 1.3 to 3.4 times faster for D = 3 to 12 (p = 2, 16384², H100), the tensor cores from D = 16
    (docs/dev/nvrtc-tensor-core-min-d.md)."""

    tensor_core_grad_min_o: int = 5
    """Smallest number of outputs O for which a float32 gradient runs on the tensor cores.  The
    SIMT kernel keeps a power of two ≥ O outputs per pair, so its cost grows with O, while the
    tensor-core kernel costs the same for every O ≤ 8: it wins from this O on."""

    sign_product_min_o: int = 3
    """Smallest O for which a float32 sign(d − b) gradient (p = 1) runs as the bf16 sign product
    on sm_90 (`wgmma`).  Its cost is the same for every O ≤ 8 while the SIMT kernel's grows
    with O: it wins from this O on."""

    sign_product_min_features: int = 96
    """Smallest number of features N (the rows of `b` and `d`) for which the sign product runs.  Its block
    holds 128 features, so its cost is flat up to 128 while the other kernels' grows with N: with 3 to 64
    features the SIMT and `mma.sync` kernels were 1.1 to 11 times faster, with 128 and 256 the sign product
    1.3 times (K = 50 000, M = 16 384, O = 3 to 16, H200; docs/dev/gradient-routes.md); linear in N, the
    others reach its time near 96."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in (*_PAIR_COUNTS, *_MIN_OUTPUTS, *_MIN_FEATURES):
                if type(value) is not int:
                    raise TypeError(f"NvrtcTuning.{f.name}: expected an int, got {type(value).__name__} {value!r}")
                if f.name in _PAIR_COUNTS and not 0 <= value <= THREAD_PAIRS:
                    raise ValueError(
                        f"NvrtcTuning.{f.name}: expected a number of pairs from 0 to {THREAD_PAIRS}, got {value}"
                    )
                if f.name in _MIN_OUTPUTS and value < 1:
                    raise ValueError(f"NvrtcTuning.{f.name}: expected a number of outputs >= 1, got {value}")
                if f.name in _MIN_FEATURES and value < 1:
                    raise ValueError(f"NvrtcTuning.{f.name}: expected a number of features >= 1, got {value}")
            elif type(value) is not bool:
                raise TypeError(f"NvrtcTuning.{f.name}: expected a bool, got {type(value).__name__} {value!r}")


DEFAULT_TUNING = NvrtcTuning()
"""The measured defaults: what the registered `nvrtc` backend plans with."""
