"""Benchmarks: ``python -m mlx_lattice.bench [--quick] [--json out.json]``.

Workloads come from realistic geometry (a synthetic 64-beam LiDAR street
sweep, the voxelized surface of a closed mesh at 256^3, uniform random
voxels). Every figure is reported next to ratios measured in the same run:
the fraction of this machine's NumPy sgemm throughput, and the speed-up over
an explicit gather -> NumPy matmul -> scatter baseline on the same layer.
"""

from __future__ import annotations

import argparse
import json
import sys

from .. import _ext, num_threads, scenes
from .gpu import run_gpu
from .layers import format_header, format_row, run_attention, run_grouped, run_layer, run_unet, spconv_available
from .network import run_network_layers
from .profile import run_cpu_profile
from .quantized import run_quantized
from .startup import run_startup
from .timing import sgemm_gflops
from .workloads import layers, workload


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlx_lattice.bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a subset that runs in under a minute")
    p.add_argument("--json", help="write the cases as a JSON list to this path")
    p.add_argument("--workloads", default=None, help="comma list of lidar,mesh,random")
    p.add_argument("--dtypes", default=None, help="comma list (default float32,float16; quick: float32)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-baseline", action="store_true", help="skip the NumPy gather-matmul baseline")
    p.add_argument("--no-spconv", action="store_true", help="skip spconv even when it is installed")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="gpu: the CUDA routes")
    p.add_argument("--channels", default=None,
                   help="with --device gpu or --quantized: comma list of subm channel counts")
    p.add_argument("--profile", action="store_true",
                   help="where a MinkUNet training step's time goes: host graph building and evaluation, "
                        "primitives by kind (mlx_lattice/bench/profile.py; --device gpu: CUDA's, cuda_profile.py)")
    p.add_argument("--grouped", action="store_true",
                   help="grouped and depthwise layers (cpu.grouped_gather) on the first workload")
    p.add_argument("--attention", action="store_true", help="only the CPU serialized-patch attention case")
    p.add_argument("--network-layers", action="store_true",
                   help="every convolution product of a MinkUNet training step by layer and pass (CPU time)")
    p.add_argument("--width", type=float, default=None,
                   help="the MinkUNet width: with --network-layers or --profile on the CPU (default 0.5) "
                        "or --quantized (default 1.0)")
    p.add_argument("--startup", action="store_true",
                   help="a new process's first training steps, with an empty and a warm kernel cache")
    p.add_argument("--quantized", action="store_true",
                   help="int8 / int4 against float weights on the CPU: a subm 3x3x3 C->C layer per channel count "
                        "(--channels, default 32,64,128,256) and a MinkUNet forward pass (docs/quantization.md)")
    args = p.parse_args(argv)
    if args.quantized:
        args.width = args.width or 1.0
        return run_quantized(args)
    args.width = args.width or 0.5
    if args.attention:
        return run_attention(args)
    if args.network_layers:
        return run_network_layers(args)
    if args.startup:
        return run_startup(args)
    if args.profile and args.device == "cpu":
        return run_cpu_profile(args)
    if args.device == "gpu":
        return run_gpu(args)
    if args.grouped:
        coords, desc = workload((args.workloads or "lidar").split(",")[0], args.quick)
        print(f"mlx_lattice bench --grouped: {num_threads()} threads, {desc}, {len(coords):,} voxels")
        print("vs numpy = speed-up over gather -> per-group NumPy einsum -> scatter; vs block-diag = "
              "speed-up over the ungrouped gather-GEMM with a block-diagonal weight (same run)")
        cases = []
        for c, g in ((64, 64), (128, 128), (64, 8), (128, 4)):
            case = run_grouped(coords, c, g, args.repeats or (2 if args.quick else 3))
            cases.append(case)
            print(f"{case['case']:<28} fwd {case['forward_ms']:8.2f} ms  fwd+bwd {case['train_step_ms']:8.2f} ms  "
                  f"{case['gflops']:6.1f} GFLOP/s  vs numpy {case['vs_numpy']:6.1f}x  "
                  f"vs block-diag {case['vs_block_diagonal']:6.1f}x", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(cases, f, indent=1)
        return 0
    quick = args.quick
    wls = (args.workloads or ("lidar" if quick else "lidar,mesh,random")).split(",")
    dtypes = (args.dtypes or ("float32" if quick else "float32,float16")).split(",")
    repeats = args.repeats or (2 if quick else 3)
    sgemm = sgemm_gflops()
    print(f"mlx_lattice bench: {num_threads()} threads, CPU path {_ext.cpu_isa()}, NumPy sgemm {sgemm:.1f} GFLOP/s"
          " (2048^3, same run)")
    use_spconv = not args.no_spconv and spconv_available()
    print("ratios: sgemm = useful GFLOP/s / sgemm GFLOP/s; vs base = speed-up over gather->NumPy matmul->scatter")
    print("        vs spconv = speed-up over spconv 2.x CPU (1 torch thread; its CPU path races with more)"
          if use_spconv else "        spconv not installed: no spconv comparison (pip install torch==2.13.0 spconv==2.3.8)")
    print(format_header(), flush=True)
    cases = []
    peak = {"sgemm": sgemm}

    def emit(case):
        # Fractions use the best sgemm seen so far in this run (conservative
        # when the machine's throughput varies during the run).
        if case.get("gflops"):
            case["sgemm_gflops"] = peak["sgemm"]
            case["sgemm_fraction"] = case["gflops"] / peak["sgemm"]
        cases.append(case)
        print(format_row(case), flush=True)

    for wl in wls:
        coords, desc = workload(wl, quick)
        peak["sgemm"] = max(peak["sgemm"], sgemm_gflops())
        print(f"-- {wl}: {desc}: {len(coords):,} voxels, {scenes.neighbour_stats(coords):.2f} neighbours of 26"
              f" (sgemm so far {peak['sgemm']:.0f} GFLOP/s)", flush=True)
        for layer in layers(quick):
            for dt in dtypes:
                run_layer(wl, coords, layer, dt, sgemm, repeats,
                          baseline=not args.no_baseline and dt == "float32", emit=emit,
                          compare_spconv=use_spconv)
        if not quick or wl == wls[0]:
            run_unet(wl, coords, dtypes[0], sgemm, max(1, repeats - 1), emit)
    best = peak["sgemm"]
    for case in cases:
        if case.get("gflops"):
            case["sgemm_gflops"], case["sgemm_fraction"] = best, case["gflops"] / best
    print(f"best NumPy sgemm in this run: {best:.1f} GFLOP/s (JSON fractions use it)")
    for case in cases:
        if case["route"] == "network":
            print(f"network fraction ({case['workload']}, {case['layer']} training step, maps built inside): "
                  f"{case['sgemm_fraction']:.0%} of sgemm on {case['useful_gflop']:.1f} useful GFLOP")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cases, f, indent=1)
        print(f"wrote {len(cases)} cases to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
