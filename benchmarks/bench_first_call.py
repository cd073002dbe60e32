"""The first call of a kernel variant in a fresh process, per backend: cold (empty JIT caches) and warm.

asv's ``timeraw_`` benchmarks run their code in a new Python process and time its statement alone: here the
statement is the first call of a variant (:data:`kermac.benchmarking.FIRST_CALL_VARIANTS`, through
:func:`kermac.benchmarking.call_variant`) and the device's synchronisation; the set-up, untimed, points kermac's and
Triton's caches (``KERMAC_CACHE_DIR``, ``TRITON_CACHE_DIR``) at a private directory, creates the device context and
two operands and imports kermac (which loads no backend: the first call does). ``cold`` gives every process an empty
directory of its own, so the call compiles (and on Triton autotunes); ``warm`` shares one that ``setup`` filled by
running the same code once. Directories come from ``tempfile.mkdtemp`` (private to the user) and are removed in
``teardown``. On the CPU only the reference backend runs, at a tiny size (the process start and import dominate).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

from kermac.benchmarking import FIRST_CALL_VARIANTS

from ._harness import DEVICE, backend_names, refusal

SIZE = (4096, 64) if DEVICE == "cuda" else (64, 8)
"""Rows and features of both operands."""


def first_call_code(backend: str, variant: str, caches: str, fresh: bool) -> tuple[str, str]:
    """``(statement, setup)`` of the first call of ``variant`` on ``backend`` in a new process whose caches live in
    ``caches`` (in a new private directory inside it where ``fresh``)."""
    m, d = SIZE
    directory = f"tempfile.mkdtemp(dir={caches!r})" if fresh else repr(caches)
    setup = f"""
        import os, tempfile
        caches = {directory}
        os.environ["KERMAC_CACHE_DIR"] = os.path.join(caches, "kermac")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(caches, "triton")
        import torch
        x, z = torch.randn({m}, {d}, device={DEVICE!r}), torch.randn({m}, {d}, device={DEVICE!r})
        if {DEVICE!r} == "cuda":
            torch.cuda.synchronize()
        from kermac.benchmarking import call_variant
    """
    statement = f"""
        call_variant({variant!r}, x, z, {backend!r})
        if {DEVICE!r} == "cuda":
            torch.cuda.synchronize()
    """
    return textwrap.dedent(statement), textwrap.dedent(setup)


VARIANTS = list(FIRST_CALL_VARIANTS if DEVICE == "cuda" else FIRST_CALL_VARIANTS[:1])
"""Every variant on a GPU; on the CPU one (each sample is a new process)."""


class FirstCall:
    params = (backend_names(), VARIANTS, ["cold", "warm"])
    param_names = ["implementation", "variant", "caches"]
    number = 1  # one first call per process
    repeat = (1, 3, 60.0)
    warmup_time = 0.0
    timeout = 600  # a cold Triton variant compiles its autotuning configurations

    def setup(self, impl: str, variant: str, caches: str) -> None:
        why = refusal(impl)
        if why is not None:
            raise NotImplementedError(f"backend {impl!r} not timed here: {why}")
        self.caches = tempfile.mkdtemp(prefix="kermac-asv-first-call-")
        if caches == "warm":
            statement, setup = first_call_code(impl, variant, self.caches, fresh=False)
            try:
                subprocess.run([sys.executable, "-c", setup + statement], check=True, env=dict(os.environ))
            except BaseException:
                shutil.rmtree(self.caches, ignore_errors=True)  # asv runs no teardown after a failed setup
                raise

    def teardown(self, impl: str, variant: str, caches: str) -> None:
        shutil.rmtree(getattr(self, "caches", ""), ignore_errors=True)

    def timeraw_first_call(self, impl: str, variant: str, caches: str) -> tuple[str, str]:
        return first_call_code(impl, variant, self.caches, fresh=caches == "cold")
