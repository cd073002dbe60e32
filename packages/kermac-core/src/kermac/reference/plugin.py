"""Entry point of the reference backend (kept import-light: the backend loads on first use)."""

from __future__ import annotations

from kermac.hookspecs import hookimpl


@hookimpl
def kermac_backends() -> list:
    from kermac.reference.backend import ReferenceBackend

    return [ReferenceBackend()]
