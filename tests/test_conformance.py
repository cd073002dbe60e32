"""Every registered backend -- the built-in ones and any plugin installed here -- through the
conformance suite of `kermac.testing`, the one third-party backends run: on the CPU (Triton through
its interpreter) and, marked `gpu`, on CUDA.  A backend named in KERMAC_REQUIRE_BACKENDS is checked
even when it is not installed, and fails instead of skipping where it cannot run."""

from __future__ import annotations

import pytest
import torch
from helpers import REQUIRED

from kermac.benchmarking import REFERENCE_BACKEND
from kermac.problem import SUPPORTED_DTYPES
from kermac.testing import CASES, PRODUCT_CASES, backend_names, conformance_tests

CPU_DTYPES = (torch.float32, torch.float64)
"""The dtypes backends run in on the CPU (the reference backend runs all, cheaply): the interpreted
Triton kernels make every dtype cost seconds."""

INTERPRETED_ON_CPU = frozenset({"triton"})
"""Backends whose CPU runs go through an interpreter (Triton's, TRITON_INTERPRET=1)."""
INTERPRETED_MAX_TERMS = 1 << 20
"""The largest cases (`Case.terms`) interpreted backends run on the CPU.  The multi-block cases, larger
than every tile in every dimension (3 to 100 million terms), would multiply the interpreted run's
cost several times over; they run on the GPU, and the multi-tile cases (under 400 000 terms) still
make the interpreted kernels loop over tiles."""
INTERPRETED_MAX_PRODUCT_TERMS = 1 << 15
"""The largest product cases (`Case.terms` of their kernel) interpreted backends run on the CPU: the
multi-tile and multi-block products take seconds each interpreted; they run on the GPU, and
`gaussian_long_n` (N beyond every tile, 4 050 terms) still makes the interpreted product loop over tiles of N."""

for _name in dict.fromkeys((*backend_names(), *sorted(REQUIRED))):
    _cpu_dtypes = SUPPORTED_DTYPES if _name == REFERENCE_BACKEND else CPU_DTYPES
    _interpreted = _name in INTERPRETED_ON_CPU
    _cpu_cases = [c for c in CASES if c.terms <= INTERPRETED_MAX_TERMS] if _interpreted else CASES
    _cpu_products = [c for c in PRODUCT_CASES if not _interpreted or c.terms <= INTERPRETED_MAX_PRODUCT_TERMS]
    _cpu = conformance_tests(
        _name,
        devices=["cpu"],
        dtypes=_cpu_dtypes,
        cases=_cpu_cases,
        products=_cpu_products,
        required=_name in REQUIRED,
    )
    globals().update(_cpu)
    _gpu = conformance_tests(_name, devices=["cuda"], dtypes=SUPPORTED_DTYPES, required=_name in REQUIRED)
    globals().update({f"{key}_gpu": pytest.mark.gpu(test) for key, test in _gpu.items()})
