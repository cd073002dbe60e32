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
from kermac.testing import backend_names, conformance_tests

CPU_DTYPES = (torch.float32, torch.float64)
"""The dtypes backends run in on the CPU (the reference backend runs all, cheaply): the interpreted
Triton kernels make every dtype cost seconds."""

for _name in dict.fromkeys((*backend_names(), *sorted(REQUIRED))):
    _cpu_dtypes = SUPPORTED_DTYPES if _name == REFERENCE_BACKEND else CPU_DTYPES
    globals().update(conformance_tests(_name, devices=["cpu"], dtypes=_cpu_dtypes, required=_name in REQUIRED))
    _gpu = conformance_tests(_name, devices=["cuda"], dtypes=SUPPORTED_DTYPES, required=_name in REQUIRED)
    globals().update({f"{key}_gpu": pytest.mark.gpu(test) for key, test in _gpu.items()})
