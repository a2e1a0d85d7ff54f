"""How the package writes the files it keeps (the tuning cache, the CUDA
kernel cache and its list, the route log), so that processes sharing them
never see or leave a part of a write."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_whole(path: Path, data: bytes) -> None:
    """``data`` into ``path`` as a whole: a temporary file beside it, flushed
    to disk and renamed into place, so a reader (or a crash) sees the old
    file or the new one, never a part. The file keeps the mode it had (new
    files: readable by all); the temporary file is removed if anything fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            mode = 0o644
        os.chmod(tmp, mode)  # mkstemp makes the file private
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def append_line(path, line: str) -> None:
    """One line appended in one write to a file opened for appending, so
    the lines of processes sharing the file never interleave."""
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(lock_path: Path):
    """An exclusive advisory lock on ``lock_path`` for the block. Where the
    platform has none, the block runs unlocked: whole-file renames and
    one-write appends still keep each file whole."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as f:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
