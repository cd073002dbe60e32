"""Directories only the current user can write, for everything kermac keeps on disk.

kermac loads compiled kernels from its cache, so a directory another local user could write
would let them choose code that runs in this process.  Every directory kermac writes to goes
through `ensure_private_dir`:

- a missing one is created with mode `0o700` (its missing parents with the default mode);
- an existing one must be a real directory (not a symbolic link), owned by this process's user
  (`os.getuid()`) and writable by neither its group nor others; otherwise
  `UnsafeDirectoryError` names the path, its owner and its mode;
- one that passes but that its owner cannot use (`chmod 000`) is restored to `0o700` and
  the repair reported with `logger.warning`: it is the user's own directory, so nothing of
  anyone else's is trusted by doing so.

On Windows (no `os.getuid`) only the directory and symbolic-link checks apply; who may write
there is the ACLs' business.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from kermac.logs import logger

__all__ = ["UnsafeDirectoryError", "ensure_private_dir", "private_problem"]

_POSIX = hasattr(os, "getuid")


class UnsafeDirectoryError(PermissionError):
    """A directory kermac would use is not private to the user: `path` and what is wrong, `problem`."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            f"kermac refuses to use {path}: it {problem}. kermac only reads and writes files in a real directory "
            "(not a symbolic link) that you own and that neither your group nor others can write; remove it, "
            "or `chmod 700` it if it is yours and you trust what it holds"
        )
        self.path = path
        self.problem = problem


def _describe_owner(uid: int) -> str:
    """`"uid 1000 (alice)"`: the number and, where the system knows it, the user name."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def private_problem(st: os.stat_result) -> str | None:
    """Why a directory with `lstat` result `st` is not private to this user, or `None`."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not _POSIX:
        return None
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid():
        return f"is owned by {_describe_owner(st.st_uid)}, not by you ({_describe_owner(os.getuid())}); mode {mode:#o}"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or by others (mode {mode:#o}, owner {_describe_owner(st.st_uid)})"
    return None


def ensure_private_dir(path: Path, *, create: bool = True) -> None:
    """Check that `path` is a directory private to this user, creating it (`0o700`) if `create`.

    Raises `FileNotFoundError` if it is missing and `create` is false,
    `NotADirectoryError` if it is a file (not a link) and `UnsafeDirectoryError` if it
    is not private (see the module documentation).
    """
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass  # created meanwhile by another process: checked below like any other
        except FileExistsError:
            pass
    st = os.lstat(path)
    problem = private_problem(st)
    if problem is not None:
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
        raise UnsafeDirectoryError(path, problem)
    if _POSIX and stat.S_IMODE(st.st_mode) & stat.S_IRWXU != stat.S_IRWXU:
        logger.warning(
            "kermac: %s was mode %#o, which left you unable to use it; restored it to 0o700",
            path,
            stat.S_IMODE(st.st_mode),
        )
        os.chmod(path, 0o700)
