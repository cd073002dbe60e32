"""Suite-wide pytest set-up: GPU gating and reproducible random seeds.

- Tests marked ``gpu`` run only where ``torch.cuda.is_available()`` and the device's compute
  capability is at least 8.0; elsewhere they are skipped with the reason.  ``pytest -m gpu`` on
  the GPU machine runs just them.
- Without a CUDA GPU, ``TRITON_INTERPRET=1`` is set so the Triton backend runs on the CPU.  The
  registered Triton backend runs untuned (``TritonTuning(autotune=False)``: on a GPU one
  compilation per program instead of one per tile configuration; the interpreter never tunes;
  ``kermac bench`` measures the tuned backend), also after a test rebuilds the registry
  (``registry.reset``): the Triton plugin's hook hands every discovery an untuned backend.
- The autouse ``seed`` fixture seeds torch's generators (CPU and every CUDA device) from a fresh random
  value each run and prints it, which pytest shows when the test fails.  ``KERMAC_TEST_SEED=N``
  replays a failure with the seed it printed.
- Under pytest-xdist (``-n W``) each worker's torch uses ``cores // W`` CPU threads (of the cores this
  process may run on), not every core: W workers each spinning a thread per core oversubscribe the
  host, and the float64 CPU references of the GPU tests can then take minutes instead of seconds.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest
import torch

MIN_CAPABILITY = (8, 0)

# Without a CUDA GPU the Triton backend runs its kernels through Triton's interpreter; the
# variable must be set before any Triton kernel is defined, i.e. before the backend loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(max(1, cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def _gpu_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU; torch.cuda.is_available() is False"
    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name()
        return f"needs compute capability >= 8.0; {name} has {capability[0]}.{capability[1]}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = _gpu_skip_reason() if gpu_items else None
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True, scope="session")
def _triton_untuned() -> Iterator[None]:
    """The Triton plugin's `kermac_backends` hook returns a backend with autotuning off.

    Patched at the hook rather than on the registered backend: `registry.reset` (which tests call)
    makes the registry discover the plugins again, and every discovery calls the hook for a new
    backend, which a patch of the old one would not reach.
    """
    try:
        from kermac_backend_triton import plugin
        from kermac_backend_triton.tuning import TritonTuning
    except ImportError:  # the Triton backend is not installed here
        yield
        return
    from kermac import registry
    from kermac.hookspecs import hookimpl

    untuned = TritonTuning(autotune=False)

    @hookimpl
    def kermac_backends() -> list:
        from kermac_backend_triton.backend import TritonBackend

        return [TritonBackend(tuning=untuned)]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plugin, "kermac_backends", kermac_backends)
        registry.reset()  # a registry built before this fixture holds a tuned backend
        yield
    registry.reset()


@pytest.fixture(autouse=True)
def seed() -> int:
    """Seed torch with a fresh random value (or ``KERMAC_TEST_SEED``) and return it."""
    fixed = os.environ.get("KERMAC_TEST_SEED", "").strip()
    value = int(fixed) if fixed else random.SystemRandom().randrange(2**32)
    torch.manual_seed(value)
    print(f"seed = {value}  (replay: KERMAC_TEST_SEED={value})")
    return value
