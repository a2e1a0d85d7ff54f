"""The route tuner's persistent cache: one small JSON file in the user cache
directory, shared by every process and rank of the machine.

Path: ``$MLX_LATTICE_TUNE_CACHE`` (``~`` expanded; a relative path is taken
from the working directory), else ``$XDG_CACHE_HOME/mlx_lattice/tuning.json``
where that variable holds an absolute path, else
``~/.cache/mlx_lattice/tuning.json``. An empty variable counts as unset.

Format (``FORMAT_VERSION``)::

    {"format": "mlx_lattice route tuning", "version": 1,
     "entries": {"<key>": {"route": ..., "variant": {...}, "static": ...,
                           "timings_ms": {...}, "measured": "<UTC time>"}}}

Concurrency: a writer takes an exclusive lock on ``<path>.lock`` (``fcntl``;
where that is missing the rename alone keeps the file whole), reads the file,
adds the keys it lacks and writes the result to a temporary file in the same
directory, flushed to disk and renamed into place. The first usable entry
written for a key stays: a later writer adopts it (:meth:`TuningCache.merge`
returns the file's entries), so processes and ranks sharing the file take
the same route for a key. Readers take no lock: a rename replaces the file
whole.

What a reader cannot use is never used, and is said (``RuntimeWarning``,
once per file, entry and reason):

- an entry whose fields have the wrong types (:func:`entry_problem`) is
  skipped; the next write drops it;
- a file that is not JSON or not this format is not read, and a write
  leaves it alone (it may be someone else's file): ``python -m mlx_lattice
  tune`` or ``tune --clear`` replaces it;
- a cache of an older format version is not read and is replaced by the
  next write; one of a newer version (a newer mlx_lattice's) is not read
  and not written.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

from . import _files

FORMAT = "mlx_lattice route tuning"
FORMAT_VERSION = 1
ENV_PATH = "MLX_LATTICE_TUNE_CACHE"

_warned: set = set()
_warn_lock = threading.Lock()


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME`` where it is an absolute path (the XDG rule: a
    relative one is ignored), else ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if base and os.path.isabs(base):
        return Path(base)
    return Path(os.path.expanduser("~")) / ".cache"


def default_path() -> Path:
    env = os.environ.get(ENV_PATH, "").strip()
    if env:
        return Path(env).expanduser()
    return user_cache_dir() / "mlx_lattice" / "tuning.json"


def _warn_once(path: Path, reason: str, what: str = "ignored") -> None:
    with _warn_lock:
        if (str(path), reason) in _warned:
            return
        _warned.add((str(path), reason))
    warnings.warn(f"route tuning cache {path}: {reason}; {what}", RuntimeWarning, stacklevel=5)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def entry_problem(entry) -> str | None:
    """Why an entry cannot be used as it is (a field of the wrong type or
    value), or None. Fields not listed here are kept as they are."""
    if not isinstance(entry, dict):
        return f"the entry is {type(entry).__name__}, not an object"
    route = entry.get("route")
    if not isinstance(route, str) or not route:
        return f"'route' is {route!r}, not a route name"
    variant = entry.get("variant", {})
    if not isinstance(variant, dict):
        return f"'variant' is {type(variant).__name__}, not an object"
    for k, v in variant.items():
        # a variant is a route's keyword arguments: tile sizes and the like
        if not isinstance(v, (int, str)) or isinstance(v, bool):
            return f"'variant' value {k}={v!r} is not an integer or a string"
    for name in ("static", "note", "measured"):
        v = entry.get(name)
        if v is not None and not isinstance(v, str):
            return f"{name!r} is {v!r}, not a string"
    timings = entry.get("timings_ms")
    if timings is not None:
        if not isinstance(timings, dict):
            return f"'timings_ms' is {type(timings).__name__}, not an object of milliseconds"
        for k, v in timings.items():
            if not _number(v) or not math.isfinite(v) or v < 0:
                return f"'timings_ms' value {k}={v!r} is not a finite number of milliseconds"
    for name in ("shape", "dropped"):
        v = entry.get(name)
        if v is not None and not isinstance(v, dict):
            return f"{name!r} is {type(v).__name__}, not an object"
    return None


class Contents(NamedTuple):
    """A cache file as read: the usable ``entries``, the ``problems`` of
    the others (key -> why), and ``state``: ``missing``, ``ok``,
    ``unreadable``, ``foreign`` (not JSON, or not this format), ``older``
    or ``newer`` (another format version); ``reason`` says more."""

    entries: dict
    problems: dict
    state: str
    reason: str | None = None

    @property
    def writable(self) -> bool:
        """Whether a library write may replace the file: it is absent, empty,
        this version's, or an older version's (whose entries no release
        reads any more)."""
        return self.state in ("missing", "ok", "older")


def parse(text: str) -> Contents:
    """A cache file's text, judged (see :class:`Contents`)."""
    if not text.strip():
        return Contents({}, {}, "missing", "empty file")
    try:
        data = json.loads(text)
    except ValueError as e:
        return Contents({}, {}, "foreign", f"not valid JSON ({e.__class__.__name__}: {e})")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return Contents({}, {}, "foreign", "not a route tuning cache")
    version = data.get("version")
    if version != FORMAT_VERSION:
        if _number(version) and version > FORMAT_VERSION:
            return Contents({}, {}, "newer", f"format version {version!r} (a newer mlx_lattice's), this "
                            f"build reads {FORMAT_VERSION}")
        return Contents({}, {}, "older", f"format version {version!r}, this build reads {FORMAT_VERSION}")
    raw = data.get("entries")
    if not isinstance(raw, dict):
        return Contents({}, {}, "older", f"'entries' is {type(raw).__name__}, not an object")
    entries, problems = {}, {}
    for key, entry in raw.items():
        why = entry_problem(entry)
        if why is None:
            entries[key] = entry
        else:
            problems[key] = why
    return Contents(entries, problems, "ok")


_WHAT = {
    "foreign": "not read, and not written over (python -m mlx_lattice tune --clear replaces it)",
    "older": "ignored (the next tuned entry rewrites it)",
    "newer": "not read, and not written over (a newer mlx_lattice's cache; tune --clear replaces it)",
    "unreadable": "not read",
}


class NotWritable(OSError):
    """The file holds something a write must not replace (see the module doc)."""


class TuningCache:
    """One cache file (see the module doc)."""

    def __init__(self, path=None):
        self.path = Path(path).expanduser() if path is not None else default_path()

    def read(self) -> Contents:
        """The file as it is, judged; says nothing."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return Contents({}, {}, "missing")
        except (OSError, UnicodeDecodeError) as e:
            return Contents({}, {}, "unreadable", f"unreadable ({e})")
        return parse(text)

    def say(self, reason: str, what: str) -> None:
        """A warning about this file: ``route tuning cache <path>: <reason>;
        <what>``, once per process, file and reason."""
        _warn_once(self.path, reason, what)

    def contents(self) -> Contents:
        """The file as :meth:`read` judges it, with a warning (once per
        process, file and reason) for what cannot be used."""
        got = self.read()
        if got.state in _WHAT:
            self.say(got.reason, _WHAT[got.state])
        for key, why in got.problems.items():
            self.say(f"entry {key!r}: {why}", "not used (the next write to the file drops it)")
        return got

    def load(self) -> dict:
        """Every usable entry of the file ({} when there is none), with a
        warning (once per process) for what is not usable."""
        return self.contents().entries

    def _locked(self):
        return _files.locked(self.path.with_name(self.path.name + ".lock"))

    def _write(self, entries: dict) -> None:
        data = {"format": FORMAT, "version": FORMAT_VERSION, "entries": dict(sorted(entries.items()))}
        _files.write_whole(self.path, (json.dumps(data, indent=1) + "\n").encode())

    def _writable(self) -> Contents:
        got = self.read()
        if not got.writable:
            raise NotWritable(f"{got.reason}; {_WHAT[got.state]}")
        return got

    def merge(self, new: dict, keep: Callable[[str, dict], bool] | None = None) -> dict:
        """Add the entries of `new` whose keys the file lacks; returns the
        file's entry for every key of `new` (an earlier writer's wins).
        ``keep(key, entry)``: whether the file's usable entry for a key of
        `new` stays (default: every one does); one that does not is
        replaced. Raises OSError (:class:`NotWritable` for a file that must
        not be replaced) where the file cannot be written."""
        with self._locked():
            got = self._writable()
            entries = dict(got.entries)
            added = {k: v for k, v in new.items()
                     if k not in entries or (keep is not None and not keep(k, entries[k]))}
            if added:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                for v in added.values():
                    v.setdefault("measured", stamp)
                entries.update(added)
                self._write(entries)
            return {k: entries[k] for k in new}

    def remove(self, keys=None) -> int:
        """Remove `keys` (None: every entry, and the file is replaced by an
        empty cache whatever it held); returns how many were removed."""
        with self._locked():
            got = self.read() if keys is None else self._writable()
            gone = list(got.entries) if keys is None else [k for k in keys if k in got.entries]
            entries = {k: v for k, v in got.entries.items() if k not in set(gone)}
            if gone or keys is None or got.problems:
                self._write({} if keys is None else entries)
            return len(gone)

    def check_writable(self) -> None:
        """Raise OSError where the file's directory takes no new file (a
        read-only directory): a write of the cache would fail there."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        os.unlink(tmp)

    def repair(self, unusable: Callable[[str, dict], str | None] | None = None) -> dict:
        """Make the file one this build reads whole: replace a file of
        another format or version (a newer one's included) with an empty
        cache, and drop the malformed entries and those ``unusable(key,
        entry)`` gives a reason for. Returns {"replaced": the old file's
        state and reason or None, "dropped": {key: why}}."""
        with self._locked():
            got = self.read()
            if got.state == "unreadable":
                raise OSError(got.reason)
            replaced = None if got.state in ("missing", "ok") else f"{got.state}: {got.reason}"
            dropped = dict(got.problems)
            if unusable is not None:
                for key, entry in got.entries.items():
                    why = unusable(key, entry)
                    if why is not None:
                        dropped[key] = why
            if replaced or dropped:
                self._write({k: v for k, v in got.entries.items() if k not in dropped})
            return {"replaced": replaced, "dropped": dropped}
