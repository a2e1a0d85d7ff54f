"""Call records for the ``record_*`` context managers of the library's
modules (``ops.record_products``, ``algebra.record_calls``,
``nn.normalization.record_norms``): profilers read what a model ran through
them instead of replacing module functions."""

from __future__ import annotations

import contextlib
import threading


class CallRecorder:
    """The lists that open ``record()`` blocks collect into: every record
    goes to each open block (blocks nest, and may be open on several
    threads). Costs one truth test per call while none is open."""

    def __init__(self):
        self._open: list[list] = []
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._open)

    @contextlib.contextmanager
    def record(self):
        log: list = []
        with self._lock:
            self._open.append(log)
        try:
            yield log
        finally:
            with self._lock:
                # by identity: two empty logs compare equal
                self._open = [o for o in self._open if o is not log]

    def add(self, item) -> None:
        with self._lock:
            for log in self._open:
                log.append(item)
