"""Every registered backend -- the built-in ones and any plugin installed here -- through the
conformance suite of `kermac.testing`, the one third-party backends run: on the CPU (Triton through
its interpreter) and, marked `gpu`, on CUDA.  A backend named in KERMAC_REQUIRE_BACKENDS is checked
even when it is not installed, and fails instead of skipping where it cannot run."""

from __future__ import annotations

import pytest
from helpers import REQUIRED

from kermac.testing import backend_names, conformance_tests

for _name in dict.fromkeys((*backend_names(), *sorted(REQUIRED))):
    _devices = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
    globals().update(conformance_tests(_name, devices=_devices, required=_name in REQUIRED))
