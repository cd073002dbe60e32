"""Entry point of the `nvrtc` backend (import-light: cuda.core loads on first use)."""

from __future__ import annotations

from kermac.hookspecs import hookimpl


@hookimpl
def kermac_backends() -> list:
    from kermac_backend_nvrtc.backend import NvrtcBackend

    return [NvrtcBackend()]
