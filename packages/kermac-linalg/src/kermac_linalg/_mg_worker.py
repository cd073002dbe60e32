"""One cusolverMg call in a fresh process, the workaround for cusolverMg's handle defect.

The parent keeps every byte of the matrix on its devices: it shares the per-device arrays with the
child through CUDA IPC (`torch.multiprocessing`'s reductions), the child runs
`kermac_linalg._cusolvermg.syevd` (or the workspace query) on them in place and writes the
eigenvalues, status and workspace size to a file the parent reads back.  A fresh process means a
fresh CUDA context, so no cusolverMg state survives from one call to the next.

The child is `python -m kermac_linalg._mg_child RESULT_PATH` with the pickled request on stdin.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch
import torch.multiprocessing  # registers the CUDA IPC reductions with ForkingPickler

from ._cusolvermg import MgResult

__all__ = ["run_isolated"]

_STDERR_TAIL = 4000


def run_isolated(device_ids: list[int], local: list[torch.Tensor], n: int, block: int, *, solve: bool) -> MgResult:
    """`syevd` (`solve`) or the workspace query, in a child process.

    The devices must be idle with respect to `local` (the caller synchronised them).  Raises
    `RuntimeError` with the child's error and the tail of its stderr if it fails.
    """
    request = {"devices": device_ids, "local": local, "n": n, "block": block, "solve": solve}
    payload = bytes(ForkingPickler.dumps(request))
    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="kermac-mg-") as tmp:
        result_path = os.path.join(tmp, "result.pkl")
        proc = subprocess.run(
            [sys.executable, "-m", "kermac_linalg._mg_child", result_path],
            input=payload,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            check=False,
        )
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()  # release the shared arrays' IPC references held for the child
        reply = None
        if os.path.exists(result_path):
            with open(result_path, "rb") as f:
                reply = pickle.load(f)
    stderr = proc.stderr.decode(errors="replace")[-_STDERR_TAIL:]
    if reply is None or "error" in reply:
        detail = reply["error"] if reply else f"the worker exited with status {proc.returncode} and no result"
        raise RuntimeError(f"multi-GPU eigh worker failed: {detail}\n--- worker stderr (tail) ---\n{stderr}")
    return MgResult(reply["eigenvalues"], reply["info"], reply["workspace_elements"])
