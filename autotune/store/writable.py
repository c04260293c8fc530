"""Can runs be written where the user asked? Checked before anything boots.

A tune that cannot write its run folder learned it only after its preflight and the vLLM version
question, as a Python traceback; a read-only folder, one owned by another user, a file where the
folder should be, a read-only file system. `check_runs_dir` writes a probe file where the first run
would write (the folder, or where it will be made), so that whatever the reason, it is said in one line with
the folder, the reason and the fix. Root is not stopped by a folder's mode, only by a read-only
file system or a file in the way; a real write is the one test that holds for every user.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from autotune.errors import AutotuneError

FIX = "give --runs-dir (or AUTOTUNE_RUNS_DIR) a folder you can write"


class RunsDirNotWritable(AutotuneError):
    """The runs folder cannot be made or written (bad input: exit 1, nothing booted)."""


def check_runs_dir(runs_dir: Path) -> Path:
    """`runs_dir` once a probe file was written (and removed) in it, or, while it does not exist, in
    the folder above it that it will be made in; RunsDirNotWritable naming the folder, the reason
    and the fix otherwise."""
    path = Path(runs_dir)
    in_the_way = _file_in_the_way(path)
    if in_the_way is not None:
        raise RunsDirNotWritable(f"cannot write runs to {path}: {in_the_way} is a file, not a folder; {FIX}")
    # Where the first run will write: the folder, or the nearest folder above it that it will be made in
    # (a command refused later, a bad plan, must not leave an empty runs folder behind).
    where = next((p for p in (path, *path.parents) if p.exists()), path)
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".autotune-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise RunsDirNotWritable(f"cannot write runs to {path}: {_reason(exc, path)}; {FIX}") from None
    return path


def _file_in_the_way(path: Path) -> Path | None:
    """The folder itself or the nearest existing folder above it, when that is a file."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def _reason(exc: OSError, path: Path) -> str:
    if exc.errno == errno.EROFS:
        return "the file system is read-only"
    if exc.errno in (errno.EACCES, errno.EPERM):
        where = next((p for p in (path, *path.parents) if p.exists()), path)
        return f"permission denied ({where} is not writable by uid {os.getuid()})"
    return (exc.strerror or str(exc)).lower()
