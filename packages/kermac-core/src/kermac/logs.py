"""Logging for kermac: one logger, `kermac`, switched on by `debug=True` or `KERMAC_DEBUG=1`.

Every diagnostic (which backend ran, what was compiled and how long it took, cache hits) goes to
`logger.debug`.  Enabling debug output sets the logger's level to `DEBUG` and, if the
application configured no handler for it, attaches one that writes to standard error.
"""

from __future__ import annotations

import logging
import os

__all__ = ["debug_enabled", "enable_debug_logging", "logger"]

logger = logging.getLogger("kermac")
ENV_DEBUG = "KERMAC_DEBUG"
_handler: logging.Handler | None = None


def debug_enabled(debug: bool = False) -> bool:
    """True if `debug` is set or `KERMAC_DEBUG` is a true value; enables the output if so."""
    on = bool(debug) or os.environ.get(ENV_DEBUG, "").strip().lower() in {"1", "true", "yes", "on"}
    if on:
        enable_debug_logging()
    return on


def enable_debug_logging() -> None:
    """Make `kermac` debug messages visible (stderr handler unless the app configured one)."""
    global _handler
    logger.setLevel(logging.DEBUG)
    if _handler is None and not logger.handlers:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[kermac] %(message)s"))
        logger.addHandler(_handler)
