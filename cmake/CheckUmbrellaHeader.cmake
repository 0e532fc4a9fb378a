# CheckUmbrellaHeader.cmake — ctest's example.umbrella_cxx17 / example.umbrella_cxx20 (cmake -P).
#
# Compiles a file that includes kvcache/kvcache.h with CXX at -std=c++${STD}:
#   STD 17  must fail with exactly one error, the header's "needs C++20" #error,
#           and a short output (not one error per C++20 feature the headers use);
#   STD 20  must compile cleanly (-Wall -Wextra -Wpedantic -Werror), and the
#           umbrella must include every header of the core library: each one
#           under include/kvcache/ and include/kvcache/kernels/ except the C
#           interface (engine/, cuda/ and replay/ are other targets).
foreach(var CXX STD SOURCE GENERATED WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "CheckUmbrellaHeader: -D${var}=... is required")
  endif()
endforeach()

file(MAKE_DIRECTORY "${WORK}")
set(program "${WORK}/umbrella_cxx${STD}.cpp")
file(WRITE "${program}" "#include \"kvcache/kvcache.h\"\nint main() { return 0; }\n")
execute_process(COMMAND "${CXX}" -std=c++${STD} -fsyntax-only -Wall -Wextra -Wpedantic -Werror
  "-I${SOURCE}/include" "-I${GENERATED}" "${program}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")

if(STD STREQUAL "17")
  string(REGEX MATCHALL "error:" errors "${out}")
  list(LENGTH errors n_errors)
  string(LENGTH "${out}" n_chars)
  if(rc EQUAL 0 OR NOT n_errors EQUAL 1 OR n_chars GREATER 1000
     OR NOT out MATCHES "kvcache needs C\\+\\+20")
    message(FATAL_ERROR "C++17: expected one 'kvcache needs C++20' error in a short output, "
                        "got status ${rc}, ${n_errors} errors, ${n_chars} characters")
  endif()
  message(STATUS "umbrella header in C++17: the one C++20 error")
  return()
endif()

if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the umbrella header does not compile as C++${STD}")
endif()
file(READ "${SOURCE}/include/kvcache/kvcache.h" umbrella)
file(GLOB core RELATIVE "${SOURCE}/include" "${SOURCE}/include/kvcache/*.h"
  "${SOURCE}/include/kvcache/*.h.in" "${SOURCE}/include/kvcache/kernels/*.h")
list(REMOVE_ITEM core kvcache/kvcache.h kvcache/c_api.h)
set(missing)
foreach(header ${core})
  string(REGEX REPLACE "\\.in$" "" header "${header}")
  string(FIND "${umbrella}" "#include \"${header}\"" at)
  if(at EQUAL -1)
    list(APPEND missing "${header}")
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "kvcache/kvcache.h leaves out: ${missing}")
endif()
list(LENGTH core n_core)
message(STATUS "umbrella header in C++${STD}: compiles, includes all ${n_core} core headers")
