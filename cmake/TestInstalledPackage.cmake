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
file(GLOB_RECURSE pc_files "${WORK}/prefix/*/kvcache.pc")  # kvcache-c.pc beside it
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
foreach(app lifecycle engine_tokens lifecycle_c lifecycle_c_shared lifecycle_c_shared_pc)
  run("${WORK}/consumer/${app}")
endforeach()
# The shared programs must have loaded the installed libkvcache_c.so.
foreach(app lifecycle_c_shared lifecycle_c_shared_pc)
  execute_process(COMMAND ldd "${WORK}/consumer/${app}" OUTPUT_VARIABLE ldd_out)
  if(NOT ldd_out MATCHES "libkvcache_c\\.so[^\n]*=> ${WORK}/prefix/")
    message(FATAL_ERROR "${app} does not load libkvcache_c.so from ${WORK}/prefix:\n${ldd_out}")
  endif()
endforeach()
message(STATUS "installed package: every consumer built and ran")
