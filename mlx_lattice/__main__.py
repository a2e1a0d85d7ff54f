"""Command line: ``python -m mlx_lattice {demo,bench,routes,convert,doctor,tune,cuda-prebuild} ...``."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlx_lattice")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="MinkUNet on a voxelized scene (synthetic LiDAR sweep or a point file)")
    demo.add_argument("path", nargs="?", help=".npy/.ply/.bin point file or mesh (default: synthetic sweep)")
    demo.add_argument("--voxel-size", type=float, help="default 0.1 m for the sweep, automatic for a file")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    demo.add_argument("--width", type=float, default=0.5, help="MinkUNet width (default 0.5)")
    demo.add_argument("--steps", type=int, default=2, help="forward+backward passes to time")
    demo.add_argument("--train-steps", type=int, default=16, help="Adam steps fitting the labels")
    demo.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    demo.add_argument("--png", default="mlx_lattice_demo.png", help="picture path")
    demo.add_argument("--route-log", help="write the route records of the last step as JSON")

    sub.add_parser("bench", help="benchmarks (see python -m mlx_lattice.bench --help)", add_help=False)

    routes_cmd = sub.add_parser("routes", help="print the route registry")
    fmt = routes_cmd.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="the docs/routes.md table")
    fmt.add_argument("--json", action="store_true", help="JSON: the registry, or with --mac the plan")
    routes_cmd.add_argument("--mac", choices=["m3", "m4", "m5"],
                            help="with --log: the Metal route each recorded call would take on this Mac tier, "
                            "and the share of multiply-adds on matrix units (docs/mac.md)")
    routes_cmd.add_argument("--log", help="a recorded run: RouteLog.dump JSON or MLX_LATTICE_ROUTE_LOG lines")
    routes_cmd.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                            help="with --mac: ask as if the features had this dtype")

    conv = sub.add_parser("convert", help="spconv / TorchSparse / MinkowskiEngine checkpoint to safetensors")
    conv.add_argument("--from", dest="source", required=True, choices=["spconv", "torchsparse", "minkowski"])
    conv.add_argument("--axes", default="xyz", help="what the source's coordinate columns hold (default xyz)")
    conv.add_argument("--layout", default="KRSC", help="spconv weight layout: KRSC (2.x), RSCK (1.x), RSKC")
    conv.add_argument("--prefix", default="", help="convert only the entries whose names start with this")
    conv.add_argument("input", help=".pth checkpoint (needs torch) or safetensors file")
    conv.add_argument("output", help="converted .safetensors; load it with "
                      "mlx_lattice.convert.load_converted(path, model)")

    doctor = sub.add_parser("doctor", help="what this install can run here: versions, backends, "
                            "Metal libraries, capability tier, the route a typical layer takes")
    doctor.add_argument("--json", action="store_true")

    tune = sub.add_parser("tune", help="measure the routes of a MinkUNet's convolution shapes on a scan "
                          "into the route tuning cache and print the choices (docs/tuning.md)")
    from .bench.tuner import add_arguments as tune_arguments

    tune_arguments(tune)

    pre = sub.add_parser("cuda-prebuild", help="compile the CUDA kernels of the training steps into the "
                         "kernel cache ahead of time, side by side (an image build, a cluster's setup)")
    pre.add_argument("--arch", help="the GPU architecture, e.g. sm_90 (default: the GPU's; name it where "
                     "no GPU is visible)")
    pre.add_argument("--dtypes", default="float16,bfloat16,float32", help="feature dtypes (default all three)")
    pre.add_argument("--workers", type=int, help="compiler processes (default: one per core but one, at most 8)")

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        from .bench.__main__ import main as bench_main

        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run

        return run(args)
    if args.command == "tune":
        from .bench.tuner import main as tune_main

        return tune_main(args)
    if args.command == "doctor":
        from .doctor import main as doctor_main

        return doctor_main(args)
    if args.command == "routes":
        from . import routes

        if args.mac or args.log:
            if not (args.mac and args.log):
                parser.error("routes: --mac and --log go together")
            if args.markdown:
                parser.error("routes: --markdown prints the registry; with --mac, ask for text or --json")
            from . import mac_plan

            try:
                p = mac_plan.plan(mac_plan.load(args.log), args.mac, args.dtype)
            except (OSError, UnicodeDecodeError) as e:
                parser.error(f"routes: cannot read --log {args.log}: {e}")
            print(json.dumps(p, indent=2) if args.json else mac_plan.render(p))
            return 0
        if args.dtype:
            parser.error("routes: --dtype goes with --mac and --log")
        if args.markdown:
            sys.stdout.write(routes.markdown())
        elif args.json:
            print(json.dumps(routes.list_routes(), indent=2))
        else:
            for r in routes.list_routes():
                print(f"{r['name']:<34} {r['backend']:<6} {r['priority']:>4}  {r['predicate']}")
        return 0
    if args.command == "cuda-prebuild":
        import re

        if args.arch is not None and not re.fullmatch(r"sm_\d{2,3}[a-z]?", args.arch):
            parser.error(f"cuda-prebuild: --arch must look like sm_90, got {args.arch!r}")
        if args.workers is not None and args.workers < 1:
            parser.error(f"cuda-prebuild: --workers must be at least 1, got {args.workers}")
        import mlx.core as mx

        names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        bad = [d for d in names if d not in ("float16", "bfloat16", "float32")]
        if bad or not names:
            parser.error(f"cuda-prebuild: --dtypes takes float16, bfloat16 and float32, got {args.dtypes!r}")
        from .backends.cuda import jit

        try:
            r = jit.prebuild([getattr(mx, d) for d in names], args.arch, args.workers)
        except (OSError, RuntimeError, ValueError) as e:
            print(f"cuda-prebuild: {e}", file=sys.stderr)
            return 1
        print(f"{r['compiled']} kernels compiled for {r['arch']} in {r['seconds']:.1f} s, {r['cached']} "
              f"already there, {r['failed']} failed; kept in {r['directory']}")
        if r["list_lines_dropped"]:
            print(f"the cache's kernel list lost {r['list_lines_dropped']} lines this package cannot use "
                  "(another release's kernels, damaged or repeated lines)")
        return 1 if r["failed"] else 0
    if args.command == "convert":
        from . import convert

        try:
            sd = {k: v for k, v in convert.load_state_dict(args.input).items() if k.startswith(args.prefix)}
            n = convert.save_converted(sd, args.output, source=args.source, axes=args.axes, layout=args.layout)
        except (ValueError, TypeError) as e:
            parser.error(f"convert: {e}")
        print(f"{n} tensors -> {args.output}; load them with "
              f"mlx_lattice.convert.load_converted({args.output!r}, model)")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
