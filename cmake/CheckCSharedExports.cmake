# CheckCSharedExports.cmake — ctest's example.c_shared_exports (cmake -P).
#
# LIBRARY: libkvcache_c.so; HEADER: kvcache/c_api.h. Fails unless the
# library's defined dynamic symbols are exactly the functions the header
# declares (kvc_<name>( ... ): nothing of the C++ library, Highway or xxHash
# leaks out, and no declared function is missing.
foreach(var LIBRARY HEADER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "CheckCSharedExports: -D${var}=... is required")
  endif()
endforeach()
find_program(NM nm REQUIRED)
execute_process(COMMAND "${NM}" -D --defined-only --format=posix "${LIBRARY}"
  OUTPUT_VARIABLE nm_out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm -D failed (${rc}) on ${LIBRARY}")
endif()
set(exported)
string(REPLACE "\n" ";" nm_lines "${nm_out}")
foreach(line IN LISTS nm_lines)
  # posix format: "name type value size"; versioned names end in @VER / @@VER
  if(line MATCHES "^([^ @]+)(@@?[^ ]*)? ([A-Za-z]) ")
    set(name "${CMAKE_MATCH_1}")  # the next MATCHES resets CMAKE_MATCH_*
    if(CMAKE_MATCH_3 MATCHES "^[TtWwiDdBbRrVv]$")
      list(APPEND exported "${name}")
    endif()
  endif()
endforeach()
list(REMOVE_DUPLICATES exported)

file(READ "${HEADER}" header)
string(REGEX MATCHALL "kvc_[a-z0-9_]+\\(" calls "${header}")
set(declared)
foreach(call IN LISTS calls)
  string(REGEX REPLACE "\\($" "" name "${call}")
  list(APPEND declared "${name}")
endforeach()
list(REMOVE_DUPLICATES declared)

set(extra ${exported})
list(REMOVE_ITEM extra ${declared})
set(missing ${declared})
list(REMOVE_ITEM missing ${exported})
list(LENGTH exported n_exported)
if(extra OR missing)
  message(FATAL_ERROR "libkvcache_c.so exports ${n_exported} symbols; not declared in the "
                      "header: [${extra}]; declared but not exported: [${missing}]")
endif()
message(STATUS "libkvcache_c.so exports exactly the ${n_exported} functions of c_api.h")
