"""The route tuner's persistent cache: one small JSON file in the user cache
directory, shared by every process and rank of the machine.

Path: ``$MLX_LATTICE_TUNE_CACHE``, else ``$XDG_CACHE_HOME/mlx_lattice/tuning.json``
(``~/.cache/mlx_lattice/tuning.json``).

Format (``FORMAT_VERSION``)::

    {"format": "mlx_lattice route tuning", "version": 1,
     "entries": {"<key>": {"route": ..., "variant": {...}, "static": ...,
                           "timings_ms": {...}, "measured": "<UTC time>"}}}

Concurrency: a writer takes an exclusive lock on ``<path>.lock`` (``fcntl``;
where that is missing the rename alone keeps the file whole), reads the file,
adds the keys it lacks and writes the result to a temporary file in the same
directory, renamed into place. The first entry written for a key stays: a
later writer adopts it (:meth:`TuningCache.merge` returns the file's entries),
so processes and ranks sharing the file take the same route for a key.
Readers take no lock: a rename replaces the file whole.

A file that is not JSON, not this format, or of another version is ignored
with a warning (once per path and reason) and replaced by the next write.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path

FORMAT = "mlx_lattice route tuning"
FORMAT_VERSION = 1

_warned: set = set()
_warn_lock = threading.Lock()


def default_path() -> Path:
    env = os.environ.get("MLX_LATTICE_TUNE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mlx_lattice" / "tuning.json"


def _warn_once(path: Path, reason: str) -> None:
    with _warn_lock:
        if (str(path), reason) in _warned:
            return
        _warned.add((str(path), reason))
    warnings.warn(f"route tuning cache {path}: {reason}; ignored (the next tuned entry rewrites it)",
                  RuntimeWarning, stacklevel=3)


def _valid_entry(entry) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("route"), str)
        and isinstance(entry.get("variant", {}), dict)
    )


def parse(text: str, path: Path) -> dict:
    """The entries of a cache file's text; {} (with a warning) when it is
    not a cache of this version. Malformed entries are skipped."""
    try:
        data = json.loads(text)
    except ValueError as e:
        _warn_once(path, f"not valid JSON ({e.__class__.__name__}: {e})")
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        _warn_once(path, "not a route tuning cache")
        return {}
    if data.get("version") != FORMAT_VERSION:
        _warn_once(path, f"format version {data.get('version')!r}, this build reads {FORMAT_VERSION}")
        return {}
    return {k: v for k, v in data["entries"].items() if isinstance(k, str) and _valid_entry(v)}


class TuningCache:
    """One cache file (see the module doc)."""

    def __init__(self, path=None):
        self.path = Path(path).expanduser() if path is not None else default_path()

    def load(self) -> dict:
        """Every valid entry of the file ({} when there is none)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as e:
            _warn_once(self.path, f"unreadable ({e})")
            return {}
        return parse(text, self.path)

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a+") as f:
            try:
                import fcntl
            except ImportError:  # no advisory locks here: the rename still keeps the file whole
                yield
                return
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _write(self, entries: dict) -> None:
        data = {"format": FORMAT, "version": FORMAT_VERSION, "entries": dict(sorted(entries.items()))}
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
                f.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def merge(self, new: dict) -> dict:
        """Add the entries of `new` whose keys the file lacks; returns the
        file's entry for every key of `new` (an earlier writer's wins)."""
        with self._locked():
            entries = self.load()
            added = {k: v for k, v in new.items() if k not in entries}
            if added:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                for v in added.values():
                    v.setdefault("measured", stamp)
                entries.update(added)
                self._write(entries)
            return {k: entries[k] for k in new}

    def remove(self, keys=None) -> int:
        """Remove `keys` (None: every entry); returns how many were removed."""
        with self._locked():
            entries = self.load()
            gone = list(entries) if keys is None else [k for k in keys if k in entries]
            for k in gone:
                del entries[k]
            if gone or not self.path.exists():
                self._write(entries)
            return len(gone)
