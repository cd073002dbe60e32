"""Suite-wide pytest set-up: GPU gating and reproducible random seeds.

- Tests marked ``gpu`` run only where ``torch.cuda.is_available()`` and the device's compute
  capability is at least 8.0; elsewhere they are skipped with the reason.  ``pytest -m gpu`` on
  the GPU machine runs just them.
- Without a CUDA GPU, ``TRITON_INTERPRET=1`` is set so the Triton backend runs on the CPU; with
  one, the registered Triton backend runs untuned (``TritonTuning(autotune=False)``: one
  compilation per program instead of one per tile configuration; ``kermac bench`` measures the
  tuned backend).
- The autouse ``seed`` fixture seeds torch's generators (CPU and every CUDA device) from a fresh random
  value each run and prints it, which pytest shows when the test fails.  ``KERMAC_TEST_SEED=N``
  replays a failure with the seed it printed.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

MIN_CAPABILITY = (8, 0)

# Without a CUDA GPU the Triton backend runs its kernels through Triton's interpreter; the
# variable must be set before any Triton kernel is defined, i.e. before the backend loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
def _triton_untuned_on_the_gpu():
    """The registered Triton backend with autotuning off, on a GPU (under the interpreter it never tunes)."""
    if not torch.cuda.is_available():
        yield
        return
    try:
        from kermac.registry import get_backend
        from kermac_backend_triton.tuning import TritonTuning

        backend = get_backend("triton")
    except (ImportError, ValueError):  # the Triton backend is not installed here
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend, "tuning", TritonTuning(autotune=False))
        yield


@pytest.fixture(autouse=True)
def seed() -> int:
    """Seed torch with a fresh random value (or ``KERMAC_TEST_SEED``) and return it."""
    fixed = os.environ.get("KERMAC_TEST_SEED", "").strip()
    value = int(fixed) if fixed else random.SystemRandom().randrange(2**32)
    torch.manual_seed(value)
    print(f"seed = {value}  (replay: KERMAC_TEST_SEED={value})")
    return value
