# TestInstalledPackage.cmake — ctest's example.installed_package (cmake -P).
#
# Installs the build tree BUILD into a scratch prefix under WORK, moves the
# prefix elsewhere (the CMake and pkg-config packages must not hold absolute
# paths), then configures, builds and runs tools/examples/consumer against it
# with the same generator and compilers. Any failing step fails the test.
foreach(var BUILD WORK SOURCE GENERATOR CXX C)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "TestInstalledPackage: -D${var}=... is required")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " shown "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${shown}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK}")
run("${CMAKE_COMMAND}" --install "${BUILD}" --prefix "${WORK}/staged" --component devel)
file(RENAME "${WORK}/staged" "${WORK}/prefix")
file(GLOB_RECURSE pc_files "${WORK}/prefix/*/kvcache.pc")
list(LENGTH pc_files n_pc)
if(NOT n_pc EQUAL 1)
  message(FATAL_ERROR "expected one installed kvcache.pc, found: ${pc_files}")
endif()
get_filename_component(pc_dir "${pc_files}" DIRECTORY)

set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
run("${CMAKE_COMMAND}" -S "${SOURCE}/tools/examples/consumer" -B "${WORK}/consumer"
  -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${WORK}/prefix"
  "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_C_COMPILER=${C}")
run("${CMAKE_COMMAND}" --build "${WORK}/consumer")
foreach(app lifecycle engine_tokens lifecycle_c)
  run("${WORK}/consumer/${app}")
endforeach()
message(STATUS "installed package: all three consumers built and ran")
