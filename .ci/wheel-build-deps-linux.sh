#!/usr/bin/env bash
# cibuildwheel before-build step on Linux. MLX's Linux wheels are tagged
# manylinux_2_35 and the newest PyPA build images have glibc 2.34, so pip
# will not install them there. The build only needs MLX's headers, CMake
# config and libmlx.so to link against (it never loads them), so the wheels
# are unpacked into the build interpreter for the target platform, and the
# build runs without isolation. The repaired wheels are tested on a
# glibc >= 2.35 host (.github/workflows/wheels.yml). The releases are the
# newest supported MLX and its nanobind (cmake/mlx_release.py); the wheel's
# metadata then pins that MLX.
set -euo pipefail
python -m pip install "scikit-build-core>=0.11" "nanobind==3.1.0" build
site="$(python -c "import sysconfig; print(sysconfig.get_path('purelib'))")"
python -m pip install --no-deps --only-binary=:all: --upgrade \
  --platform "manylinux_2_35_$(uname -m)" --target "$site" \
  "mlx==0.32.4" "mlx-cpu==0.32.4"
