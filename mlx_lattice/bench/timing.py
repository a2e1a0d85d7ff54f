"""Timers and same-run references of the benches: the best of repeated
calls (wall or CPU time), and this machine's NumPy sgemm throughput that
every figure is reported against."""

from __future__ import annotations

import time

import numpy as np

LAYER_WARMUP_S = 0.2
# Layer passes are timed over at least this much time (best call of all):
# a few milliseconds' kernel then gets as wide a window as the sgemm
# reference's three 2048^3 products, and one slow call from the host
# machine's other work does not decide its row.
LAYER_MIN_TIME_S = 0.25
# The training step (~1 s on 2 cores) is timed over at least this much:
# about 8 steps rather than 2, so that one step slowed by the host's other
# work does not decide the network row.
NETWORK_MIN_TIME_S = 8.0


def best_time(
    fn, repeats: int, clock=time.perf_counter, warmup_s: float = 0.0, min_time_s: float = 0.0, max_calls: int = 500
) -> float:
    """Best of `repeats` calls of fn, in seconds of `clock`, after warming up:
    one call (allocations, lazily built views), then more until `warmup_s`
    seconds of wall time have passed. With `min_time_s`, calls go on past
    `repeats` until that much wall time has been timed (at most `max_calls`)."""
    end = time.perf_counter() + warmup_s
    fn()
    while time.perf_counter() < end:
        fn()
    best = float("inf")
    start = time.perf_counter()
    calls = 0
    while calls < repeats or (time.perf_counter() - start < min_time_s and calls < max_calls):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
        calls += 1
    return best


def cpu_time(fn, repeats: int) -> float:
    """Best process CPU seconds of fn (all threads): on a machine shared with
    other jobs, far steadier than wall time, and comparable across calls."""
    return best_time(fn, repeats, clock=time.process_time)


def sgemm_gflops(n=2048, repeats=3) -> float:
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    b = a.copy()
    return 2 * n**3 / best_time(lambda: a @ b, repeats) / 1e9
