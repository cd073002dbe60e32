"""kermac.memory's overlap tests against a brute-force enumeration of addresses and their exact
search (which the O(1) fast paths must agree with), and their speed on large layouts."""

from __future__ import annotations

import itertools
import math
import time

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kermac import memory
from kermac.memory import internal_overlap, overlap

DTYPES = [torch.uint8, torch.float16, torch.float32, torch.float64]
#: One byte buffer every view of a test lies in (so views of different dtypes share memory).
BUFFER_BYTES = 1 << 13


@st.composite
def views(draw: st.DrawFn, buffer: torch.Tensor) -> torch.Tensor:
    """A strided view of ``buffer``: any dtype, 0-4 dims of size 0-5, strides 0-40 (elements), any offset."""
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(0, 4))
    sizes = draw(st.lists(st.integers(0, 5), min_size=rank, max_size=rank))
    strides = draw(
        st.lists(
            st.one_of(st.sampled_from([0, 1, 2, 3, 4, 6, 8, 12, 16]), st.integers(0, 40)), min_size=rank, max_size=rank
        )
    )
    elements = buffer.view(dtype)
    span = sum(s * (n - 1) for s, n in zip(strides, sizes, strict=True) if n > 0)
    offset = draw(st.integers(0, min(elements.numel() - span - 1, 200)))
    return elements.as_strided(sizes, strides, offset)


def element_addresses(t: torch.Tensor) -> list[int]:
    """The byte address of every element of ``t``, index by index."""
    base, esize = t.data_ptr(), t.element_size()
    return [
        base + esize * sum(i * s for i, s in zip(index, t.stride(), strict=True))
        for index in itertools.product(*(range(n) for n in t.shape))
    ]


def covered_bytes(t: torch.Tensor) -> set[int]:
    return {a + k for a in element_addresses(t) for k in range(t.element_size())}


_buffer = torch.empty(BUFFER_BYTES, dtype=torch.uint8)


@settings(max_examples=2000, deadline=None)
@given(a=views(_buffer), b=views(_buffer))
def test_overlap_is_exact(a: torch.Tensor, b: torch.Tensor) -> None:
    """Two views of one buffer (any dtypes, strides, offsets) share a byte exactly when ``overlap`` says so."""
    assert overlap(a, b) == bool(covered_bytes(a) & covered_bytes(b))
    assert overlap(b, a) == overlap(a, b)


@settings(max_examples=2000, deadline=None)
@given(t=views(_buffer))
def test_internal_overlap_is_exact(t: torch.Tensor) -> None:
    """Two indices of one view address the same element exactly when ``internal_overlap`` says so."""
    addresses = element_addresses(t)
    assert internal_overlap(t) == (len(set(addresses)) != len(addresses))


def test_examples() -> None:
    buf = torch.empty(64)
    assert internal_overlap(torch.empty(16).as_strided((3, 3), (1, 1)))  # the example
    assert internal_overlap(torch.empty(1, 5).expand(3, 5))
    assert internal_overlap(buf.as_strided((4, 4), (5, 1))) is False
    assert internal_overlap(buf.as_strided((4, 4), (3, 1)))  # row 1 starts on row 0's last element
    assert internal_overlap(buf.as_strided((2, 3), (3, 2))) is False  # 0 2 4 | 3 5 7: interleaved, distinct
    assert not overlap(buf[:32], buf[32:]) and overlap(buf[:33], buf[32:])
    grid = buf.view(8, 8)
    assert not overlap(grid[:, ::2], grid[:, 1::2])  # interleaved columns
    assert overlap(grid[:, ::2], grid[:, 2::3])
    assert overlap(buf.view(torch.float64)[3:4], buf[7:8])  # float64 element 3 spans float32 elements 6, 7
    assert not overlap(buf.view(torch.float64)[3:4], buf[8:9])
    assert not overlap(torch.empty(3, device="meta"), torch.empty(3, device="meta"))  # no memory


def test_large_layouts_are_decided_fast() -> None:
    """Disjoint and overlapping views of one large buffer: each test well under 10 ms."""
    flat = torch.empty(10_000 * 1_000)
    grid = flat.view(10_000, 1_000)
    cases = [
        (overlap, (grid[:, :500], grid[:, 500:]), False),
        (overlap, (grid[:, ::2], grid[:, 1::2]), False),
        (overlap, (flat[: 3000 * 777].view(3000, 777), flat[3000 * 777 :][: 5000 * 123].view(5000, 123)), False),
        (overlap, (flat.as_strided((1000, 300), (1001, 3)), flat.as_strided((1000, 300), (997, 3), 1)), True),
        (overlap, (grid.T, grid[1:, :7]), True),
        (internal_overlap, (flat.as_strided((1000, 1000), (999, 1)),), True),
        (internal_overlap, (flat.as_strided((100, 100, 100), (10_007, 101, 1)),), True),
        (internal_overlap, (flat.as_strided((100, 100, 100), (10_100, 101, 1)),), False),
        (internal_overlap, (grid.T[::3],), False),
    ]
    for fn, args, expected in cases:
        start = time.perf_counter()
        assert fn(*args) is expected, (fn.__name__, [(t.shape, t.stride()) for t in args])
        assert time.perf_counter() - start < 0.01


@st.composite
def program_views(draw: st.DrawFn, buffer: torch.Tensor) -> torch.Tensor:
    """A view of ``buffer`` as programs make them: a contiguous block of any dtype (0-3 dims of size
    0-5), then up to three of transpose, a slice with a step, a new dimension expanded, a size-1
    dimension expanded."""
    dtype = draw(st.sampled_from(DTYPES))
    elements = buffer.view(dtype)
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    offset = draw(st.integers(0, 300))
    t = elements[offset : offset + math.prod(shape)].view(shape)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["transpose", "slice", "new", "expand"]))
        if op == "transpose" and t.dim() >= 2:
            t = t.transpose(*draw(st.permutations(range(t.dim())))[:2])
        elif op == "slice" and t.dim() >= 1:
            dim = draw(st.integers(0, t.dim() - 1))
            index = [slice(None)] * t.dim()
            index[dim] = slice(draw(st.integers(0, 3)), None, draw(st.integers(1, 3)))
            t = t[tuple(index)]
        elif op == "new":
            dim = draw(st.integers(0, t.dim()))
            t = t.unsqueeze(dim).expand(*t.shape[:dim], draw(st.integers(0, 3)), *t.shape[dim:])
        elif op == "expand" and 1 in t.shape:
            dim = t.shape.index(1)
            t = t.expand(*t.shape[:dim], draw(st.integers(0, 3)), *t.shape[dim + 1 :])
    return t


def _any_view(buffer: torch.Tensor) -> st.SearchStrategy[torch.Tensor]:
    return st.one_of(program_views(buffer), views(buffer))


@settings(max_examples=3000, deadline=None)
@given(a=_any_view(_buffer), b=_any_view(_buffer))
def test_overlap_fast_paths_agree_with_the_search(a: torch.Tensor, b: torch.Tensor) -> None:
    """Whatever the fast paths decide (disjoint ranges, two contiguous tensors) is what the exact
    search answers, and what the bytes say."""
    expected = bool(covered_bytes(a) & covered_bytes(b))
    assert overlap(a, b) == expected
    if a.numel() and b.numel():
        assert memory._overlap_exact(a, b) == expected


@settings(max_examples=3000, deadline=None)
@given(t=_any_view(_buffer))
def test_internal_overlap_fast_path_agrees_with_the_search(t: torch.Tensor) -> None:
    addresses = element_addresses(t)
    expected = len(set(addresses)) != len(addresses)
    assert internal_overlap(t) == expected
    if t.numel():
        assert memory._internal_overlap_exact(t) == expected


def test_common_layouts_are_decided_without_the_search(monkeypatch) -> None:
    """A kernel call's usual tensors (contiguous, separate or slices of one buffer, a transposed
    view beside them) never reach the search."""

    def unreachable(*args: object) -> None:
        raise AssertionError("the exact search ran")

    monkeypatch.setattr(memory, "_solvable", unreachable)
    monkeypatch.setattr(memory, "_overlap_exact", unreachable)
    monkeypatch.setattr(memory, "_internal_overlap_exact", unreachable)
    out, x, xt = torch.empty(300, 200), torch.empty(300, 40), torch.empty(40, 300).T
    assert internal_overlap(out) is False and internal_overlap(out[:, None].expand(300, 1, 200)) is False
    assert overlap(out, x) is False and overlap(out, xt) is False and overlap(xt, out) is False
    flat = torch.empty(1000)
    assert overlap(flat[:500].view(20, 25), flat[499:].view(1, 501)) is True
    assert overlap(flat[:500].view(20, 25), flat[500:].view(20, 25)) is False
    assert overlap(flat[:500].view(20, 25).T, flat[500:]) is False


def test_different_storages_can_share_memory() -> None:
    """Storage identity decides nothing: two tensors over one Python buffer have storages of their
    own and still share bytes."""
    raw = bytearray(64)
    first = torch.frombuffer(raw, dtype=torch.float32, count=8)
    second = torch.frombuffer(raw, dtype=torch.float32, count=8, offset=16)
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    assert overlap(first, second) is True and overlap(first[:4], second) is False
