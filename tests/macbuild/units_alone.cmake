# Included by the macOS build check after project() (CMAKE_PROJECT_INCLUDE):
# once CMakeLists.txt has made its targets, unity batching is switched off on
# each of them, so that every source is compiled as its own translation unit
# (a batch would lend a unit the includes of the units before it; the check
# also sets CMAKE_DISABLE_PRECOMPILE_HEADERS for the same reason). Nothing
# else of the build changes.
function(_macbuild_units_alone)
  get_property(targets DIRECTORY "${CMAKE_SOURCE_DIR}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    set_property(TARGET ${target} PROPERTY UNITY_BUILD OFF)
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _macbuild_units_alone)
