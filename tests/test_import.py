"""Importing kermac stays cheap: no backend's heavy dependency is imported until it is used."""

from __future__ import annotations

import os
import subprocess
import sys


def test_import_kermac_loads_no_backend_dependency() -> None:
    code = (
        "import sys, torch\n"
        "before = set(sys.modules)\n"  # torch itself may import cuda.bindings
        "import kermac, kermac.presets, kermac.ir\n"
        "names = ('triton', 'cuda.core', 'cuda.bindings', 'nvmath', 'kermac_linalg')\n"
        "heavy = [m for m in names if m in sys.modules and m not in before]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"imported at 'import kermac': {result.stdout.strip()}"


def test_a_call_that_names_a_backend_loads_no_other_backends_dependency() -> None:
    """Loading the backends (plugin discovery) imports no backend's heavy dependency; a call naming the reference
    backend runs without Triton (the Triton backend imports it, and its kernels' modules, at its own first use)."""
    code = (
        "import sys, torch\n"
        "before = set(sys.modules)\n"
        "import kermac\n"
        "from kermac import registry\n"
        "registry.registered_backends()\n"
        "x = torch.randn(5, 3)\n"
        "kermac.cdist(x, x, backend='torch')\n"
        "names = ('triton', 'kermac_backend_triton.launch', 'cuda.core', 'nvmath')\n"
        "print(','.join(m for m in names if m in sys.modules and m not in before))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KERMAC_BACKEND")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert result.stdout.strip().splitlines()[-1:] in ([], [""]), f"imported: {result.stdout.strip()}"


def test_the_nvrtc_backend_checks_availability_without_importing_cuda_core() -> None:
    """cuda.core is imported at the first compile only: a call whose kernel is in the disk cache (the launcher loads
    it through `cuda.bindings`) never pays for its import."""
    code = (
        "import sys, torch\n"
        "from kermac_backend_nvrtc.backend import NvrtcBackend\n"
        "print(NvrtcBackend().availability())\n"
        "print('cuda.core' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "False", result.stdout
