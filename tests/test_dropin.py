"""Drop-in details for PyTorch users: `import kermac.linalg`, and torch.cdist's `compute_mode`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import kermac


def test_linalg_is_an_importable_module() -> None:
    """`import kermac.linalg`, `from kermac.linalg import solve` and attribute access reach one module."""
    code = (
        "import kermac.linalg, kermac_linalg\n"
        "from kermac.linalg import solve, cholesky_solve\n"
        "import kermac\n"
        "assert kermac.linalg is kermac_linalg and solve is kermac_linalg.solve\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.stdout.strip() == "ok", result.stderr


def test_linalg_without_its_package_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['kermac_linalg'] = None  # as if the package were not installed\n"
        "import kermac\n"
        "try:\n"
        "    import kermac.linalg\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "try:\n"
        "    kermac.linalg\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and all("needs the kermac-linalg package" in line for line in lines), result.stdout


@pytest.mark.parametrize(
    "mode", ["use_mm_for_euclid_dist_if_necessary", "use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist"]
)
def test_cdist_accepts_torch_compute_modes(mode: str) -> None:
    """Every compute_mode gives the exact route: near-duplicate rows keep their tiny distances."""
    x = torch.randn(40, 8, dtype=torch.float64)
    z = x + 1e-9 * torch.randn_like(x)
    expected = torch.cdist(x, z, compute_mode="donot_use_mm_for_euclid_dist")
    torch.testing.assert_close(kermac.cdist(x, z, 2.0, mode), expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(
        kermac.cdist(x, z, compute_mode=mode).diagonal(), expected.diagonal(), rtol=1e-12, atol=0
    )


def test_cdist_refuses_other_compute_modes() -> None:
    x = torch.randn(3, 2)
    with pytest.raises(
        ValueError, match=r"compute_mode: expected one of 'use_mm_for_euclid_dist_if_necessary'.*got 'fast'"
    ):
        kermac.cdist(x, x, compute_mode="fast")
