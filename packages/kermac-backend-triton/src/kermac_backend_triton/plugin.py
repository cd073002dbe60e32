"""Entry point of the Triton backend (`kermac.backends`); imports neither triton nor torch.cuda."""

from __future__ import annotations

from kermac.hookspecs import hookimpl


@hookimpl
def kermac_backends() -> list:
    from kermac_backend_triton.backend import TritonBackend

    return [TritonBackend()]
