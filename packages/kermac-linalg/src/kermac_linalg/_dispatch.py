"""Fork a batch of cuSOLVER calls over a bounded pool of streams and join it back.

`fork_join` runs task `t` (one batch entry, or one factorisation and its solves) on slot
`t mod S` of at most [`max_streams`][kermac_linalg._dispatch.max_streams] slots. Each slot's stream first waits on an
event recorded on torch's current stream (so it sees every earlier write to the inputs); each slot
gets its device workspace from torch's caching allocator *on its own stream* (so the block is
reused only in that stream's order); at the end torch's current stream waits on an event of
every slot.

The calls of a batch are issued from one worker thread per slot (`threads=True`) or all from
the calling thread; `use_threads` picks per operation (measurements in docs/linalg.md):
xsyevd/xsyevdx return only once their own stream is done, so from one thread the entries of a
batch would run one after another; xgetrf+xgetrs spend host time per entry, which worker
threads overlap; xpotrf alone is cheaper issued from the calling thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from ._cusolver import Slot, thread_slots

__all__ = ["fork_join", "max_streams", "set_max_streams", "use_threads"]

ENV_STREAMS = "KERMAC_LINALG_STREAMS"
ENV_DISPATCH = "KERMAC_LINALG_DISPATCH"
_DEFAULT_STREAMS = 8

Issue = Callable[[int, Slot, int, int], None]
"""`issue(task, slot, device_workspace_ptr, host_workspace_ptr)` queues one task's calls."""


def _initial_streams() -> int:
    raw = os.environ.get(ENV_STREAMS, "").strip()
    if not raw:
        return _DEFAULT_STREAMS
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_STREAMS} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{ENV_STREAMS} must be a positive integer, got {raw!r}")
    return value


_max_streams = _initial_streams()
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def max_streams() -> int:
    """How many batch entries may run at once (streams per device and thread); default 8."""
    return _max_streams


def set_max_streams(count: int) -> None:
    """Bound the streams a batched call uses (each holds one workspace). Also `KERMAC_LINALG_STREAMS`."""
    global _max_streams
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, got {type(count).__name__}")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    _max_streams = count


def use_threads(default: bool) -> bool:
    """Whether a batch is issued from worker threads (one per stream) or from the calling thread.

    `KERMAC_LINALG_DISPATCH=threads` or `=streams` decides for every operation; `auto`
    (or unset) takes `default`, the operation's measured better choice (`docs/linalg.md`):
    threads for `eigh`/`eigh_range` (their cuSOLVER calls wait on the host) and `solve`,
    the calling thread for `cholesky`/`cholesky_solve`.
    """
    mode = os.environ.get(ENV_DISPATCH, "").strip().lower()
    if mode not in ("", "auto", "threads", "streams"):
        raise ValueError(f"{ENV_DISPATCH} must be 'auto', 'threads' or 'streams', got {mode!r}")
    return default if mode in ("", "auto") else mode == "threads"


def fork_join(
    device: torch.device,
    tasks: int,
    device_bytes: int,
    host_bytes: int,
    issue: Issue,
    *,
    threads: bool = True,
) -> None:
    """Queue `tasks` tasks over at most [`max_streams`][kermac_linalg._dispatch.max_streams] streams of `device`; join
    them.

    Each stream gets one device workspace of `device_bytes` and its slot's host workspace of
    `host_bytes`; tasks sharing a stream run one after another and reuse them. If issuing
    raises, torch's current stream still waits for everything already queued, then the first
    error is raised.
    """
    if tasks == 0:
        return
    count = min(tasks, _max_streams)
    with torch.cuda.device(device):
        current = torch.cuda.current_stream(device)
        start = torch.cuda.Event()
        start.record(current)
        chunks = [range(k, tasks, count) for k in range(count)]
        if threads and count > 1:
            pool = _pool(device, _max_streams)
            futures = [
                pool.submit(_run_chunk, device, start, chunk, device_bytes, host_bytes, issue) for chunk in chunks
            ]
            outcomes = [f.result() for f in futures]
        else:
            slots = thread_slots(device, count)
            outcomes = [
                _issue_chunk(slot, start, chunk, device_bytes, host_bytes, issue)
                for slot, chunk in zip(slots, chunks, strict=True)
            ]
        for done, _ in outcomes:
            current.wait_event(done)
        errors = [error for _, error in outcomes if error is not None]
        if errors:
            raise errors[0]


Outcome = tuple[torch.cuda.Event, Exception | None]


def _issue_chunk(
    slot: Slot, start: torch.cuda.Event, chunk: range, device_bytes: int, host_bytes: int, issue: Issue
) -> Outcome:
    """Queue `chunk`'s tasks on `slot`; the event after them, and the error that stopped them."""
    slot.stream.wait_event(start)
    done = torch.cuda.Event()
    try:
        with torch.cuda.stream(slot.stream):
            workspace = torch.empty(device_bytes, dtype=torch.uint8, device=slot.device)
        for task in chunk:
            issue(task, slot, workspace.data_ptr(), slot.host_workspace(host_bytes))
    except Exception as error:
        return _record(done, slot), error
    return _record(done, slot), None


def _record(event: torch.cuda.Event, slot: Slot) -> torch.cuda.Event:
    event.record(slot.stream)
    return event


def _run_chunk(
    device: torch.device,
    start: torch.cuda.Event,
    chunk: range,
    device_bytes: int,
    host_bytes: int,
    issue: Issue,
) -> Outcome:
    with torch.cuda.device(device):
        slot = thread_slots(device, 1)[0]
        return _issue_chunk(slot, start, chunk, device_bytes, host_bytes, issue)


def _pool(device: torch.device, workers: int) -> ThreadPoolExecutor:
    key = device.index
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool._max_workers < workers:
            if pool is not None:
                pool.shutdown(wait=False)
            pool = _pools[key] = ThreadPoolExecutor(workers, thread_name_prefix=f"kermac-linalg-cuda{key}")
        return pool
