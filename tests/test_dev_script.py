"""scripts/dev.py: what it says about its command line (no set-up is run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[1] / "scripts" / "dev.py"


def dev(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEV), *argv], capture_output=True, text=True, timeout=60)


def test_an_unknown_command_is_named_with_the_expected_ones() -> None:
    result = dev("tset")
    assert result.returncode == 2 and result.stdout == ""
    assert "unknown command 'tset'; expected one of setup, test, bench, docs, wheels, torch" in result.stderr


@pytest.mark.parametrize("argv", [(), ("--help",), ("-h",)])
def test_help_prints_the_usage(argv: tuple[str, ...]) -> None:
    result = dev(*argv)
    assert result.returncode == 0 and "python3 scripts/dev.py setup [--force]" in result.stdout
