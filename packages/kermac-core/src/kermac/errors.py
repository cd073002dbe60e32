"""Exception types raised by kermac.

Bad arguments raise the built-in `TypeError`/`ValueError` with a message naming the argument,
the expectation and what was received.  Backend problems raise [`BackendError`][kermac.errors.BackendError].
"""

from __future__ import annotations

__all__ = ["BackendError", "BackendUnavailableError", "UnsupportedProblemError"]


class BackendError(RuntimeError):
    """Base class for errors raised while selecting or running a backend."""


class BackendUnavailableError(BackendError):
    """A backend was requested by name but cannot run on this machine (missing driver, GPU, ...)."""


class UnsupportedProblemError(BackendError):
    """A backend was requested by name but does not support this particular problem."""
