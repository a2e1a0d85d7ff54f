"""One NVRTC compiler process of jit's pool, run as a script (it imports
neither MLX nor the package, and needs no GPU).

NVRTC compiles one program at a time per process (threads queue on its
lock), so jit starts a few of these to compile a workload's kernels side by
side. Requests arrive as JSON lines on stdin: {"lib": the NVRTC library,
"options": [...], "name": ..., "source": ..., "path": where the cubin goes};
each gets one JSON line back: {"path": ..., "error": null or the log}. The
cubin is written whole, flushed to disk and renamed into place, as jit does
(a failed write leaves no temporary file behind).
"""

import ctypes
import json
import os
import sys


def compile_one(lib, options, name, source):
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None):
        return None, "nvrtcCreateProgram failed"
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        if lib.nvrtcCompileProgram(prog, len(options), opts):
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetProgramLog(prog, log)
            return None, log.value.decode(errors="replace")
        size = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        out = ctypes.create_string_buffer(size.value)
        if lib.nvrtcGetCUBIN(prog, out):
            return None, "nvrtcGetCUBIN failed"
        return out.raw, None
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def main() -> int:
    libs = {}
    for line in sys.stdin:
        req = json.loads(line)
        error = None
        try:
            lib = libs.get(req["lib"]) or libs.setdefault(req["lib"], ctypes.CDLL(req["lib"]))
            cubin, error = compile_one(lib, req["options"], req["name"], req["source"])
            if cubin is not None:
                path = req["path"]
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = f"{path}.{os.getpid()}.tmp"
                try:
                    with open(tmp, "wb") as f:
                        f.write(cubin)
                        f.flush()
                        os.fsync(f.fileno())  # on disk before the rename
                    os.replace(tmp, path)
                except OSError:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                    raise
        except OSError as e:
            error = str(e)
        sys.stdout.write(json.dumps({"path": req["path"], "error": error}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
