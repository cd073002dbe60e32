"""The child side of `._mg_worker`: one cusolverMg call in a fresh process.

`python -m kermac_linalg._mg_child RESULT_PATH` reads the pickled request (device ids, the
per-device arrays as CUDA IPC handles, N, block, solve or query) from stdin, runs it, and pickles
`{"eigenvalues", "info", "workspace_elements"}` or `{"error": traceback}` to RESULT_PATH.
"""

from __future__ import annotations

import pickle
import sys
import traceback

from ._cusolvermg import query, syevd


def _main(result_path: str) -> int:
    try:
        request = pickle.loads(sys.stdin.buffer.read())
        op = syevd if request["solve"] else query
        result = op(request["devices"], request["local"], request["n"], request["block"])
        reply = {
            "eigenvalues": result.eigenvalues,
            "info": result.info,
            "workspace_elements": result.workspace_elements,
        }
    except BaseException:
        reply = {"error": traceback.format_exc()}
    with open(result_path, "wb") as f:
        pickle.dump(reply, f)
    return 0 if "error" not in reply else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
