# Metal libraries, built at configure time so that no Metal problem can fail
# the build: each step reports success and, when it fails, a reason that the
# build records (build_info.json) and that `python -m mlx_lattice doctor` and
# the route log show. The functions only run `xcrun` and `sw_vers` through
# execute_process, so tests drive them in CMake script mode (`cmake -P`) with
# stub tools on PATH.

set(LATTICE_METAL_INSTALL_HINT
    "install Xcode (the Command Line Tools have no Metal compiler), select it with "
    "`sudo xcode-select -s /Applications/Xcode.app`, then, with Xcode 26 or later, "
    "the Metal Toolchain component: `xcodebuild -downloadComponent MetalToolchain`")
string(CONCAT LATTICE_METAL_INSTALL_HINT ${LATTICE_METAL_INSTALL_HINT})

# Options every Metal source is compiled with (MLX's extension defaults:
# warnings on, no fast math).
set(LATTICE_METAL_FLAGS -Wall -Wextra -fno-fast-math -Wno-c++17-extensions -Wno-c++20-extensions
    -Wmetal-addr-spaces)

# lattice_macos_deployment_target(<out>)
# MACOSX_DEPLOYMENT_TARGET when set, else the host's macOS version, and never
# below 14.0 (MLX's own floor).
function(lattice_macos_deployment_target out)
  set(version "$ENV{MACOSX_DEPLOYMENT_TARGET}")
  if(NOT version STREQUAL "" AND NOT version MATCHES "^[0-9]+(\\.[0-9]+)*$")
    message(WARNING "mlx_lattice: ignoring MACOSX_DEPLOYMENT_TARGET='${version}' (expected a version such as 14.0)")
    set(version "")
  endif()
  if(version STREQUAL "")
    execute_process(
      COMMAND sw_vers -productVersion
      RESULT_VARIABLE rc OUTPUT_VARIABLE version ERROR_QUIET
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT rc STREQUAL "0" OR NOT version MATCHES "^[0-9]+(\\.[0-9]+)*$")
      set(version "")
    endif()
  endif()
  if(version STREQUAL "" OR version VERSION_LESS 14.0)
    set(version 14.0)
  endif()
  set(${out} ${version} PARENT_SCOPE)
endfunction()

# _lattice_first_error(<out> <text>): the first compiler error line, or the
# first non-empty line, shortened for a one-line reason.
function(_lattice_first_error out text)
  string(REPLACE "\r" "" text "${text}")
  string(REPLACE ";" "," text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(first "")
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    if(line MATCHES "error:")
      set(first "${line}")
      break()
    elseif(first STREQUAL "" AND NOT line STREQUAL "")
      set(first "${line}")
    endif()
  endforeach()
  string(LENGTH "${first}" n)
  if(n GREATER 300)
    string(SUBSTRING "${first}" 0 300 first)
    string(APPEND first "...")
  endif()
  set(${out} "${first}" PARENT_SCOPE)
endfunction()

# lattice_metal_toolchain(<ok_var> <reason_var> [<version_var>])
# Whether `xcrun -sdk macosx metal` runs. Without Xcode (Command Line Tools
# only) xcrun finds no `metal`; with Xcode 26 and no Metal Toolchain component
# `metal` exists but refuses to run. Either way the reason says how to install.
function(lattice_metal_toolchain ok_var reason_var)
  find_program(_lattice_xcrun xcrun NO_CACHE)
  if(NOT _lattice_xcrun)
    set(${ok_var} FALSE PARENT_SCOPE)
    set(${reason_var} "xcrun not found: ${LATTICE_METAL_INSTALL_HINT}" PARENT_SCOPE)
    return()
  endif()
  execute_process(
    COMMAND ${_lattice_xcrun} -sdk macosx metal --version
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc STREQUAL "0")
    set(${ok_var} TRUE PARENT_SCOPE)
    set(${reason_var} "" PARENT_SCOPE)
    if(ARGC GREATER 2)
      string(STRIP "${out}" out)
      set(${ARGV2} "${out}" PARENT_SCOPE)
    endif()
  else()
    _lattice_first_error(first "${err}\n${out}")
    set(${ok_var} FALSE PARENT_SCOPE)
    set(${reason_var} "the Metal compiler does not run (${first}): ${LATTICE_METAL_INSTALL_HINT}" PARENT_SCOPE)
  endif()
endfunction()

# lattice_build_metallib(
#   TITLE <name> OUTPUT_DIRECTORY <dir> STD <metal std> DEPLOYMENT_TARGET <v>
#   SOURCES <files...> INCLUDE_DIRS <dirs...> [TOOLCHAIN <version text>]
#   RESULT_VARIABLE <ok_var> REASON_VARIABLE <reason_var>)
# Compiles each source to AIR and links <dir>/<name>.metallib. On any failure
# the library is removed and <reason_var> holds the first error. A stamp of
# the compiler version, options, sources and headers skips the work when
# nothing changed.
function(lattice_build_metallib)
  cmake_parse_arguments(ML "" "TITLE;OUTPUT_DIRECTORY;STD;DEPLOYMENT_TARGET;TOOLCHAIN;RESULT_VARIABLE;REASON_VARIABLE"
                        "SOURCES;INCLUDE_DIRS" ${ARGN})
  set(lib "${ML_OUTPUT_DIRECTORY}/${ML_TITLE}.metallib")
  set(air_dir "${ML_OUTPUT_DIRECTORY}/${ML_TITLE}_air")
  if(NOT ML_SOURCES)
    file(REMOVE "${lib}")
    set(${ML_RESULT_VARIABLE} FALSE PARENT_SCOPE)
    set(${ML_REASON_VARIABLE} "no sources" PARENT_SCOPE)
    return()
  endif()
  set(options ${LATTICE_METAL_FLAGS} -std=${ML_STD} -mmacosx-version-min=${ML_DEPLOYMENT_TARGET})
  foreach(dir IN LISTS ML_INCLUDE_DIRS)
    list(APPEND options "-I${dir}")
  endforeach()

  # Everything the library depends on: options, sources and local headers.
  set(stamp_text "${ML_TOOLCHAIN}\n${options}")
  set(inputs ${ML_SOURCES})
  foreach(src IN LISTS ML_SOURCES)
    get_filename_component(src_dir "${src}" DIRECTORY)
    file(GLOB headers "${src_dir}/*.h")
    list(APPEND inputs ${headers})
  endforeach()
  list(REMOVE_DUPLICATES inputs)
  foreach(f IN LISTS inputs)
    file(SHA256 "${f}" h)
    string(APPEND stamp_text "\n${f} ${h}")
  endforeach()
  string(SHA256 stamp "${stamp_text}")
  set(stamp_file "${lib}.stamp")
  if(EXISTS "${lib}" AND EXISTS "${stamp_file}")
    file(READ "${stamp_file}" old_stamp)
    if(old_stamp STREQUAL stamp)
      set(${ML_RESULT_VARIABLE} TRUE PARENT_SCOPE)
      set(${ML_REASON_VARIABLE} "" PARENT_SCOPE)
      return()
    endif()
  endif()
  file(REMOVE "${lib}" "${stamp_file}")
  file(MAKE_DIRECTORY "${air_dir}")

  set(airs "")
  foreach(src IN LISTS ML_SOURCES)
    get_filename_component(stem "${src}" NAME_WE)
    set(air "${air_dir}/${stem}.air")
    execute_process(
      COMMAND xcrun -sdk macosx metal ${options} -c "${src}" -o "${air}"
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc STREQUAL "0")
      _lattice_first_error(first "${err}\n${out}")
      get_filename_component(name "${src}" NAME)
      set(${ML_RESULT_VARIABLE} FALSE PARENT_SCOPE)
      set(${ML_REASON_VARIABLE} "${name} does not compile with -std=${ML_STD}: ${first}" PARENT_SCOPE)
      return()
    endif()
    list(APPEND airs "${air}")
  endforeach()
  execute_process(
    COMMAND xcrun -sdk macosx metal -mmacosx-version-min=${ML_DEPLOYMENT_TARGET} ${airs} -o "${lib}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc STREQUAL "0" OR NOT EXISTS "${lib}")
    file(REMOVE "${lib}")
    _lattice_first_error(first "${err}\n${out}")
    set(${ML_RESULT_VARIABLE} FALSE PARENT_SCOPE)
    set(${ML_REASON_VARIABLE} "linking ${ML_TITLE}.metallib failed: ${first}" PARENT_SCOPE)
    return()
  endif()
  file(WRITE "${stamp_file}" "${stamp}")
  set(${ML_RESULT_VARIABLE} TRUE PARENT_SCOPE)
  set(${ML_REASON_VARIABLE} "" PARENT_SCOPE)
endfunction()

# lattice_metal_libraries(
#   SOURCE_DIR <metal/> OUTPUT_DIRECTORY <dir> METAL_STD <std>
#   TENSOROPS_STD <std> TENSOROPS_TARGET <v> DEPLOYMENT_TARGET <v>
#   TENSOROPS <ON|OFF> INCLUDE_DIRS <dirs...>)
# Builds mlx_lattice.metallib (every metal/*.metal but tensorops_*) and
# mlx_lattice_tensorops.metallib (tensorops_*.metal, Metal 4 inline tensor
# ops). Sets in the caller LATTICE_METAL_BUILT / LATTICE_METAL_REASON and
# LATTICE_TENSOROPS_BUILT / LATTICE_TENSOROPS_REASON.
function(lattice_metal_libraries)
  cmake_parse_arguments(ML "" "SOURCE_DIR;OUTPUT_DIRECTORY;METAL_STD;TENSOROPS_STD;TENSOROPS_TARGET;DEPLOYMENT_TARGET;TENSOROPS"
                        "INCLUDE_DIRS" ${ARGN})
  file(GLOB sources "${ML_SOURCE_DIR}/*.metal")
  list(SORT sources)
  set(tensorops_sources ${sources})
  list(FILTER tensorops_sources INCLUDE REGEX "/tensorops_[^/]*\\.metal$")
  list(FILTER sources EXCLUDE REGEX "/tensorops_[^/]*\\.metal$")
  set(includes "${ML_SOURCE_DIR}" ${ML_INCLUDE_DIRS})

  set(metal_built FALSE)
  set(tensorops_built FALSE)
  lattice_metal_toolchain(toolchain toolchain_reason toolchain_version)
  if(NOT toolchain)
    set(metal_reason "${toolchain_reason}")
    set(tensorops_reason "no Metal toolchain")
  else()
    lattice_build_metallib(
      TITLE mlx_lattice OUTPUT_DIRECTORY "${ML_OUTPUT_DIRECTORY}" STD ${ML_METAL_STD}
      DEPLOYMENT_TARGET ${ML_DEPLOYMENT_TARGET} TOOLCHAIN "${toolchain_version}" SOURCES ${sources} INCLUDE_DIRS ${includes}
      RESULT_VARIABLE metal_built REASON_VARIABLE metal_reason)
    if(NOT metal_built)
      set(tensorops_reason "mlx_lattice.metallib was not built")
    elseif(NOT ML_TENSOROPS)
      set(tensorops_reason "disabled (MLX_LATTICE_TENSOROPS=OFF)")
    else()
      # The Metal 4 library targets macOS 26.2 whatever the package targets:
      # it is only selected there (see mlx_lattice/diagnostics.py).
      lattice_build_metallib(
        TITLE mlx_lattice_tensorops OUTPUT_DIRECTORY "${ML_OUTPUT_DIRECTORY}" STD ${ML_TENSOROPS_STD}
        DEPLOYMENT_TARGET ${ML_TENSOROPS_TARGET} TOOLCHAIN "${toolchain_version}" SOURCES ${tensorops_sources} INCLUDE_DIRS ${includes}
        RESULT_VARIABLE tensorops_built REASON_VARIABLE tensorops_reason)
    endif()
  endif()
  if(NOT tensorops_built)
    file(REMOVE "${ML_OUTPUT_DIRECTORY}/mlx_lattice_tensorops.metallib")
  endif()
  set(LATTICE_METAL_BUILT ${metal_built} PARENT_SCOPE)
  set(LATTICE_METAL_REASON "${metal_reason}" PARENT_SCOPE)
  set(LATTICE_TENSOROPS_BUILT ${tensorops_built} PARENT_SCOPE)
  set(LATTICE_TENSOROPS_REASON "${tensorops_reason}" PARENT_SCOPE)
endfunction()

# lattice_require_metal(<metal_built> <metal_reason> <tensorops_built> <tensorops_reason>)
# For release wheels (option MLX_LATTICE_REQUIRE_METAL): stop the build
# unless both libraries were built, so no wheel ships without them.
function(lattice_require_metal metal_built metal_reason tensorops_built tensorops_reason)
  if(NOT metal_built)
    message(FATAL_ERROR "mlx_lattice: MLX_LATTICE_REQUIRE_METAL is on but mlx_lattice.metallib was not built: ${metal_reason}")
  elseif(NOT tensorops_built)
    message(FATAL_ERROR "mlx_lattice: MLX_LATTICE_REQUIRE_METAL is on but mlx_lattice_tensorops.metallib was not built: ${tensorops_reason}")
  endif()
endfunction()

# _lattice_json_string(<out> <text>): <text> as a JSON string literal.
function(_lattice_json_string out text)
  string(REPLACE "\\" "\\\\" text "${text}")
  string(REPLACE "\"" "\\\"" text "${text}")
  string(REPLACE "\n" "\\n" text "${text}")
  string(REPLACE "\r" "" text "${text}")
  string(REPLACE "\t" " " text "${text}")
  set(${out} "\"${text}\"" PARENT_SCOPE)
endfunction()

# lattice_write_build_info(<file> <key> <value> ...)
# A flat JSON object of strings and booleans (TRUE/FALSE/ON/OFF values).
function(lattice_write_build_info file)
  # ARGV<n> rather than a list, so that empty values keep their place.
  set(body "")
  math(EXPR last "${ARGC} - 1")
  foreach(i RANGE 1 ${last} 2)
    math(EXPR j "${i} + 1")
    set(key "${ARGV${i}}")
    set(value "${ARGV${j}}")
    if(value MATCHES "^(TRUE|FALSE|ON|OFF)$")
      if(value)
        set(json true)
      else()
        set(json false)
      endif()
    else()
      _lattice_json_string(json "${value}")
    endif()
    if(NOT body STREQUAL "")
      string(APPEND body ",\n")
    endif()
    string(APPEND body "  \"${key}\": ${json}")
  endforeach()
  file(WRITE "${file}" "{\n${body}\n}\n")
endfunction()
