r"""What kernels may assume about the memory behind a tensor: that it is addressable, and where it overlaps.

Kernels read and write a tensor's memory at its strides.  `check_addressable` refuses the
tensors whose values are not that memory: other layouts than strided, and the negative bit of a
real view such as `c.conj().imag` (whose memory holds the negated values).

Overlap tests are exact, from sizes, strides and addresses only.
A strided tensor's element at index `(y_1, …, y_r)` starts at byte address
`base + Σ_i s_i y_i` (`base = data_ptr()`, `s_i` = stride × element size,
`0 ≤ y_i < n_i`) and covers `element_size` bytes.  Whether two tensors share a byte, or one
tensor has two indices on the same element, is a bounded linear Diophantine problem

$$
\sum_i a_i y_i = r, \qquad 0 \le y_i \le u_i,\quad a_i > 0,
$$

NP-hard in general but tiny here (one term per dimension).  `_solvable` decides it exactly
by a depth-first search that branches on the term with the fewest feasible values (bounds and
divisibility prune the rest) and solves two-term problems in closed form; a search that would
take more than `WORK_LIMIT` steps answers `None` ("undecided"), which callers treat as
an overlap.  Nothing here reads device memory or synchronises: only Python integers.

Both tests first decide the common cases in O(1) without the search: a contiguous tensor has no
two indices on one element; two tensors whose byte ranges `[first byte, last byte]` are disjoint
share nothing, and two contiguous ones whose ranges meet share a byte (each covers its whole
range).  The storage a tensor views decides nothing: different storages may hold the same memory
(`torch.from_numpy` of overlapping NumPy views, `torch.frombuffer`, DLPack), so only addresses
are compared.

Meta tensors have no memory (every `data_ptr()` is 0): `overlap` reports none for them.
"""

from __future__ import annotations

import math

import torch

__all__ = ["WORK_LIMIT", "check_addressable", "internal_overlap", "overlap"]

WORK_LIMIT = 100_000
"""Search steps after which a test gives up and answers `None` (never reached by the layouts of
real programs: disjoint ranges, slices, transposes and interleaved columns need a few steps).
"""


def check_addressable(name: str, t: torch.Tensor) -> None:
    """Raise unless kernels can read (or write) the values of `t` as its memory at its strides."""
    if t.layout != torch.strided:
        raise TypeError(f"{name}: expected a dense (strided) tensor, got layout {t.layout}")
    if t.is_neg():
        raise ValueError(
            f"{name}: expected a tensor without the negative bit (a view such as c.conj().imag, whose memory "
            f"holds the negated values); pass {name}.resolve_neg()"
        )


class _Undecided(Exception):
    """The search exceeded `WORK_LIMIT`."""


def _two_terms(a: int, u: int, b: int, v: int, r: int) -> bool:
    """Whether `a·y + b·w = r` has a solution with `0 ≤ y ≤ u`, `0 ≤ w ≤ v` (closed form)."""
    g = math.gcd(a, b)
    if r % g:
        return False
    a, b, r = a // g, b // g, r // g
    y0 = (r * pow(a, -1, b)) % b if b > 1 else 0  # every solution has y ≡ y0 (mod b)
    lo = max(0, -(-(r - b * v) // a))  # w ≤ v
    hi = min(u, r // a)  # w ≥ 0
    return lo + (y0 - lo) % b <= hi


def _search(terms: list[tuple[int, int]], r: int, budget: list[int]) -> bool:
    """Whether `Σ a·y = r` has a solution with `0 ≤ y ≤ u` for every `(a, u)` in `terms`."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _Undecided
    total = sum(a * u for a, u in terms)
    if r < 0 or r > total:
        return False
    if not terms:
        return r == 0
    if r % math.gcd(*(a for a, _ in terms)):
        return False
    if len(terms) == 1:
        return r // terms[0][0] <= terms[0][1]
    if len(terms) == 2:
        (a, u), (b, v) = terms
        return _two_terms(a, u, b, v, r)
    best = None
    for i, (a, u) in enumerate(terms):
        rest = terms[:i] + terms[i + 1 :]
        lo = max(0, -(-(r - (total - a * u)) // a))  # the other terms reach at most total − a·u
        hi = min(u, r // a)
        g = math.gcd(*(b for b, _ in rest))
        h = math.gcd(a, g)
        if r % h:  # a·y ≡ r (mod g) has no solution
            return False
        step = g // h
        y0 = ((r // h) * pow(a // h, -1, step)) % step if step > 1 else 0
        first = lo + (y0 - lo) % step
        count = 0 if first > hi else (hi - first) // step + 1
        if best is None or count < best[0]:
            best = (count, a, first, hi, step, rest)
    _, a, first, hi, step, rest = best
    return any(_search(rest, r - a * y, budget) for y in range(first, hi + 1, step))


def _solvable(terms: list[tuple[int, int]], r: int) -> bool | None:
    """`Σ a·y = r` with `0 ≤ y ≤ u` (all `a > 0`): solvable, not, or `None` if undecided."""
    merged: dict[int, int] = {}
    for a, u in terms:  # equal coefficients add up: a·y + a·y' = a·(y + y'), bounds add
        if u > 0:
            merged[a] = merged.get(a, 0) + u
    try:
        return _search(sorted(merged.items(), reverse=True), r, [WORK_LIMIT])
    except _Undecided:
        return None


def _dims(t: torch.Tensor) -> list[tuple[int, int]]:
    """`(stride, size)` of the dimensions of `t` that have more than one index."""
    return [(st, n) for st, n in zip(t.stride(), t.shape, strict=True) if n > 1]


def internal_overlap(t: torch.Tensor) -> bool | None:
    """Whether two different indices of `t` address the same element (`None`: undecided).

    A contiguous (or empty) tensor has none; other layouts are decided by `_internal_overlap_exact`.
    """
    if t.is_contiguous() or t.numel() == 0:
        return False
    return _internal_overlap_exact(t)


def _internal_overlap_exact(t: torch.Tensor) -> bool | None:
    """`internal_overlap` of a non-empty tensor by the bounded search, for any layout.

    With the dimensions in decreasing stride order, an overlap is a nonzero index difference
    `δ` with `Σ s_i δ_i = 0`, `|δ_i| ≤ n_i − 1`; let `k` be its first nonzero entry, made
    positive by symmetry.  Writing `δ_k = 1 + (n_k − 2 − v)` and `δ_i = n_i − 1 − w_i`
    (`i > k`) gives the bounded problem `s_k v + Σ_{i>k} s_i w_i = Σ_{i≥k} s_i (n_i − 1)`
    with `0 ≤ v ≤ n_k − 2`, `0 ≤ w_i ≤ 2(n_i − 1)`, one per `k`.
    """
    dims = _dims(t)
    if any(st == 0 for st, _ in dims):
        return True
    span = 0  # the usual layouts: each stride passes every element of the smaller ones
    for st, n in sorted(dims):
        if st <= span:
            break
        span += st * (n - 1)
    else:
        return False
    dims.sort(reverse=True)
    undecided = False
    for k, (sk, nk) in enumerate(dims):
        rest = dims[k + 1 :]
        found = _solvable([(sk, nk - 2)] + [(s, 2 * (n - 1)) for s, n in rest], sum(s * (n - 1) for s, n in dims[k:]))
        if found:
            return True
        undecided = undecided or found is None
    return None if undecided else False


def _end(t: torch.Tensor, start: int) -> int:
    """One past the last byte of the non-empty tensor `t` that starts at byte address `start`
    (strides are never negative, so the first element starts lowest)."""
    return start + t.element_size() * (1 + sum(st * (n - 1) for st, n in zip(t.stride(), t.shape, strict=True)))


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Whether some byte of memory lies in an element of `a` and in an element of `b`
    (`None`: undecided).  Different dtypes and views of one buffer are compared byte-exactly.

    Two contiguous tensors (each covers its whole byte range) share a byte exactly when their
    ranges meet; other layouts with disjoint ranges share none; the rest is decided by
    `_overlap_exact`.
    """
    if a.is_meta or b.is_meta:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    dense_a, dense_b = a.is_contiguous(), b.is_contiguous()
    if dense_a and dense_b:  # an empty one has an empty range
        return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes
    if a.numel() == 0 or b.numel() == 0:
        return False
    if (a0 + a.nbytes if dense_a else _end(a, a0)) <= b0 or (b0 + b.nbytes if dense_b else _end(b, b0)) <= a0:
        return False
    return _overlap_exact(a, b)


def _overlap_exact(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """`overlap` of two non-empty tensors with memory by the bounded search, for any layouts.

    Elements at `α` and `β` share a byte iff `−e_a < α − β < e_b`; with
    `α − β = −e_a + 1 + w`, `0 ≤ w ≤ e_a + e_b − 2`, and `b`'s indices reflected
    (`y → n − 1 − y`) every coefficient is positive:
    `Σ s_i x_i + Σ t_j y_j' + w' = β_0 − α_0 + e_b − 1 + Σ t_j (m_j − 1)`.  (Its right-hand
    side lies outside `[0, Σ bounds]` exactly when the byte ranges are disjoint.)
    """
    ea, eb = a.element_size(), b.element_size()
    da = [(st * ea, n) for st, n in _dims(a) if st]
    db = [(st * eb, n) for st, n in _dims(b) if st]
    a0, b0 = a.data_ptr(), b.data_ptr()
    terms = [(s, n - 1) for s, n in da + db] + [(1, ea + eb - 2)]
    return _solvable(terms, b0 - a0 + eb - 1 + sum(s * (n - 1) for s, n in db))
