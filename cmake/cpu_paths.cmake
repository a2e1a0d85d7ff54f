# lattice_cpu_paths(<var>): the instruction-set paths of the CPU kernels to
# build, as `name=LATTICE_ISA_ID` (src/cpu/isa_begin.h), widest first (its
# gather-GEMM is the longest unit to compile, and starting it early keeps
# both cores of a small machine busy to the end). Sets <var> and
# <var>_BUILT: "native" or "all".
#
# On x86-64, MLX_LATTICE_CPU_PATHS says which: `native` (a source install)
# the baseline and the wider paths the building machine can run, asked as
# the extension asks when it loads (cmake/cpu_paths_probe.cpp), so that no
# path is compiled that could never be chosen there (the AVX-512 units take
# the longest); `all` every path, for builds that run elsewhere (wheels). A
# build for another machine (cross-compiling) takes all. Elsewhere there is
# one path.
function(lattice_cpu_paths var)
  if(NOT MLX_LATTICE_CPU_PATHS MATCHES "^(native|all)$")
    message(FATAL_ERROR "MLX_LATTICE_CPU_PATHS must be native or all, not '${MLX_LATTICE_CPU_PATHS}'")
  endif()
  set(built all)
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    set(wide avx2 avx512)
    if(MLX_LATTICE_CPU_PATHS STREQUAL "native" AND NOT CMAKE_CROSSCOMPILING)
      try_run(run_status compiled ${CMAKE_CURRENT_BINARY_DIR}/cpu_paths_probe
              ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/cpu_paths_probe.cpp
              CMAKE_FLAGS "-DINCLUDE_DIRECTORIES=${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../src"
              COMPILE_OUTPUT_VARIABLE log RUN_OUTPUT_VARIABLE here)
      if(compiled AND run_status EQUAL 0)
        set(wide ${here})
        set(built native)
      else()
        message(WARNING "mlx_lattice: could not ask this CPU which instruction sets it runs; "
                        "building every CPU kernel path.\n${log}")
      endif()
    endif()
    set(paths)
    if("avx512" IN_LIST wide)
      list(APPEND paths avx512=2)
    endif()
    if("avx2" IN_LIST wide)
      list(APPEND paths avx2=1)
    endif()
    list(APPEND paths baseline=0)
  elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64|ARM64")
    set(paths neon=3)
  else()
    set(paths baseline=0)
  endif()
  set(${var} ${paths} PARENT_SCOPE)
  set(${var}_BUILT ${built} PARENT_SCOPE)
endfunction()
