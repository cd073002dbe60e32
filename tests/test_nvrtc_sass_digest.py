"""tools/nvrtc_sass_digest.py on a few variants (no GPU): labels, digests, and the comparison."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kermac_backend_nvrtc.source")
pytest.importorskip("cuda.core")

TOOL = Path(__file__).resolve().parent.parent / "tools" / "nvrtc_sass_digest.py"


@pytest.fixture(scope="module")
def digest_tool():
    spec = importlib.util.spec_from_file_location("nvrtc_sass_digest", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # worker processes unpickle its functions by module name
    spec.loader.exec_module(module)
    try:
        module.cuobjdump_path()
    except SystemExit as exc:
        pytest.skip(str(exc))
    return module


def test_labels_name_target_problem_and_setting(digest_tool) -> None:
    """Labels are built from names that do not depend on the backend's types, so trees compare."""
    labels = digest_tool.jobs("float32 3 common")
    assert "sm_90 float32 3 common pairwise;sum;(mul (sub x z) (sub x z));acc [default]" in labels
    assert {label.rsplit("[", 1)[1].rstrip("]") for label in labels} == set(digest_tool.SETTINGS)
    _source, target, name = labels["sm_90 float32 3 common pairwise;sum;(mul (sub x z) (sub x z));acc [default]"]
    assert (target, name) == ("sm_90a", "kermac_pairwise")  # the wgmma kernel
    assert labels["sm_90 float32 3 common pairwise;sum;(mul (sub x z) (sub x z));acc [mma_sync]"][1] == "sm_90"


def test_digest_compiles_each_kernel_once_and_compares(digest_tool, tmp_path) -> None:
    """A run in its own process (a fresh private cache, so ptxas reports every kernel)."""
    match = "sm_80 float32 1 common"  # cdist p = 1: k-contiguous, padded-tail and SIMT kernels
    out = tmp_path / "digest.json"
    run = subprocess.run([sys.executable, str(TOOL), "--match", match, "--jobs", "1", str(out)], capture_output=True)
    assert run.returncode == 0, run.stderr.decode()
    result = json.loads(out.read_text())
    assert len(result) == len(digest_tool.SETTINGS)
    default = result[f"{match} pairwise;sum;(abs (sub x z));acc [default]"]
    assert len(default["sha256"]) == 64 and default["registers"] > 0 and default["smem"] > 0
    assert default == result[f"{match} pairwise;sum;(abs (sub x z));acc [simt]"]  # no tensor cores for |x − z|
    assert default["sha256"] != result[f"{match} pairwise;sum;(abs (sub x z));acc [no_k_contiguous]"]["sha256"]
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(result))
    changed = dict(result) | {"extra": default}
    changed[next(iter(result))] = dict(default, sha256="0" * 64)
    after.write_text(json.dumps(changed))
    assert digest_tool.main(["--compare", str(before), str(before)]) == 0
    assert digest_tool.main(["--compare", str(before), str(after)]) == 1
    outcome = digest_tool.compare(result, changed)
    assert len(outcome["different"]) == 1 and outcome["after_only"] == ["extra"] and not outcome["before_only"]


def test_cuobjdump_is_found(digest_tool) -> None:
    assert Path(digest_tool.cuobjdump_path()).exists() or shutil.which(digest_tool.cuobjdump_path())
