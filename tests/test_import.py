"""Importing kermac stays cheap: no backend's heavy dependency is imported until it is used."""

from __future__ import annotations

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
