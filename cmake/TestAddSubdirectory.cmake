# TestAddSubdirectory.cmake — ctest's example.add_subdirectory (cmake -P).
#
# Configures tools/examples/subproject, a parent project that embeds the
# checkout SOURCE with add_subdirectory and sets no build type, into WORK with
# the same generator and compilers (the parent's own checks run then), and
# reads the compile commands it generated: every kvcache source must compile
# optimised (the Release flags kvcache gives its own targets when the parent
# names no build type), and the parent's program without them (its flags are
# the parent's business). Configured only: building would compile every
# kernel again, which example.installed_package already does.
foreach(var WORK SOURCE GENERATOR CXX C)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "TestAddSubdirectory: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${SOURCE}/tools/examples/subproject" -B "${WORK}"
  -G "${GENERATOR}" "-DKVCACHE_SOURCE_DIR=${SOURCE}" "-DCMAKE_CXX_COMPILER=${CXX}"
  "-DCMAKE_C_COMPILER=${C}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the embedding parent failed (${rc})")
endif()
if(NOT out MATCHES "kvcache_parent: embedded kvcache [0-9.]+ configured")
  message(FATAL_ERROR "the parent did not report the embedded kvcache")
endif()
if(NOT out MATCHES "kvcache: no build type")
  message(FATAL_ERROR "no configure message about the missing build type")
endif()

file(READ "${WORK}/compile_commands.json" commands)
string(JSON n_entries LENGTH "${commands}")
math(EXPR last "${n_entries} - 1")
set(n_kvcache 0)
set(n_parent 0)
foreach(i RANGE ${last})
  string(JSON file GET "${commands}" ${i} file)
  string(JSON command GET "${commands}" ${i} command)
  set(optimised OFF)
  if(command MATCHES " -O[23s]( |$)")
    set(optimised ON)
  endif()
  if(file MATCHES "/src/.*\\.cpp$")
    math(EXPR n_kvcache "${n_kvcache} + 1")
    if(NOT optimised)
      message(FATAL_ERROR "kvcache source compiled without optimisation:\n${file}\n${command}")
    endif()
  elseif(file MATCHES "/tools/examples/lifecycle\\.cpp$")
    math(EXPR n_parent "${n_parent} + 1")
    if(optimised)
      message(FATAL_ERROR "the parent's program took kvcache's flags:\n${command}")
    endif()
  endif()
endforeach()
if(n_kvcache EQUAL 0 OR NOT n_parent EQUAL 1)
  message(FATAL_ERROR "compile_commands.json: ${n_kvcache} kvcache sources, ${n_parent} parent "
                      "programs (expected some and 1)")
endif()
message(STATUS "add_subdirectory: ${n_kvcache} kvcache sources optimised, the parent's left alone")
