"""Entry point of the numpy backend (`kermac.backends`): kept light, the backend module loads in the hook."""

from __future__ import annotations

from kermac.hookspecs import hookimpl


@hookimpl
def kermac_backends() -> list:
    from kermac_backend_numpy.backend import NumpyBackend

    return [NumpyBackend()]
