"""pytest hooks: which Metal kernels ran, and how.

Register from tests/conftest.py:

    def pytest_configure(config):
        from metal_harness import plugin
        config.pluginmanager.register(plugin, "mlx_lattice_metal_harness")

With MLX_LATTICE_KERNEL_COVERAGE=<path> the session writes
{"defined": [...], "ran": [...]} (host names of the kernels in metal/*.metal);
with MLX_LATTICE_REQUIRE_KERNEL_COVERAGE=1 a kernel that never ran fails the
session.
"""

from __future__ import annotations

import json
import os

try:
    from . import HarnessError, defined_kernels, kernels_ran
except ImportError:  # loaded as a top-level module
    from metal_harness import HarnessError, defined_kernels, kernels_ran


def _coverage() -> tuple[list[str], list[str], list[str]]:
    """(defined, ran, backends) for the project's kernels."""
    try:
        defined = sorted(defined_kernels())
    except HarnessError:
        defined = []
    ran_all = kernels_ran()
    ran = sorted(k for k in ran_all if k in defined)
    backends = sorted({b for k in ran for b in ran_all[k]})
    return defined, ran, backends


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("MLX_LATTICE_KERNEL_COVERAGE")
    require = os.environ.get("MLX_LATTICE_REQUIRE_KERNEL_COVERAGE") == "1"
    if not path and not require:
        return
    defined, ran, _ = _coverage()
    if path:
        with open(path, "w") as f:
            json.dump({"defined": defined, "ran": ran}, f, indent=2)
            f.write("\n")
    if require and set(defined) - set(ran) and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if not kernels_ran():
        return
    defined, ran, backends = _coverage()
    missing = sorted(set(defined) - set(ran))
    tr = terminalreporter
    tr.write_sep("-", "metal kernels")
    tr.write_line(
        f"{len(ran)} of {len(defined)} kernels in metal/ ran, through "
        f"{', '.join(backends) or 'nothing'}"
        + (" (harness = CPU emulation of Metal)" if "harness" in backends else "")
    )
    if missing:
        tr.write_line("never ran: " + ", ".join(missing))
        if os.environ.get("MLX_LATTICE_REQUIRE_KERNEL_COVERAGE") == "1":
            tr.write_line("MLX_LATTICE_REQUIRE_KERNEL_COVERAGE=1: the session fails")
