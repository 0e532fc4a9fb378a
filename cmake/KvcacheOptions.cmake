# KvcacheOptions.cmake — compiler flags shared by every kvcache target.
#
# kvcache_warnings: an INTERFACE target carrying the warning flags (and the
# Release flags when the build type is empty, below); link it PRIVATE so the
# flags apply to our sources only, never to consumers.
# KVCACHE_SANITIZE / KVCACHE_NATIVE apply globally (every target, including
# tests and tools) because sanitizer runtimes must be linked into all of them.

add_library(kvcache_warnings INTERFACE)
target_compile_options(kvcache_warnings INTERFACE -Wall -Wextra)

# A parent project that embeds kvcache (add_subdirectory, FetchContent) and
# names no build type would have CMake compile the kernels with no
# optimisation at all (decode attention about 30x slower, silently). So when
# the configuration is empty, kvcache's own sources (everything that links
# kvcache_warnings) take the Release flags; the parent's targets keep theirs.
# On its own kvcache defaults to Release, and a named build type or a
# multi-config generator never has an empty configuration.
separate_arguments(_kvcache_release_flags UNIX_COMMAND "${CMAKE_CXX_FLAGS_RELEASE}")
target_compile_options(kvcache_warnings INTERFACE "$<$<CONFIG:>:${_kvcache_release_flags}>")
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  message(STATUS "kvcache: no build type set by the parent project; kvcache's own targets "
                 "compile with its Release flags (${CMAKE_CXX_FLAGS_RELEASE})")
endif()

if(KVCACHE_SANITIZE)
  if(NOT KVCACHE_SANITIZE MATCHES "^(address|thread|undefined)$")
    message(FATAL_ERROR "KVCACHE_SANITIZE must be address, thread, undefined or empty, "
                        "got '${KVCACHE_SANITIZE}'")
  endif()
  # -g1 (line tables: symbolized stack traces) rather than full debug info:
  # full -g retries variable tracking on the big kernel functions and made
  # the ASan compile of the attention kernel 1.3x slower (14.9 vs 11.4 min).
  set(_kvcache_san_flags -fsanitize=${KVCACHE_SANITIZE} -fno-omit-frame-pointer -g1)
  if(KVCACHE_SANITIZE STREQUAL "address")
    list(APPEND _kvcache_san_flags -fsanitize=undefined)
  endif()
  # Any report fails the test that triggered it (UBSan would otherwise print and go on).
  list(APPEND _kvcache_san_flags -fno-sanitize-recover=all)
  add_compile_options(${_kvcache_san_flags})
  add_link_options(${_kvcache_san_flags})
  message(STATUS "kvcache: building with ${_kvcache_san_flags}")
endif()

# Fewer Highway targets: each one is another instantiation of every kernel
# (attention takes several minutes per target under a sanitizer, 2 cores).
if(KVCACHE_HWY_DISABLED_TARGETS)
  if(NOT KVCACHE_HWY_DISABLED_TARGETS MATCHES "^[0-9]+$")
    message(FATAL_ERROR "KVCACHE_HWY_DISABLED_TARGETS must be a decimal bit mask, "
                        "got '${KVCACHE_HWY_DISABLED_TARGETS}'")
  endif()
  add_compile_definitions(HWY_DISABLED_TARGETS=${KVCACHE_HWY_DISABLED_TARGETS}LL)
  message(STATUS "kvcache: Highway targets disabled: mask ${KVCACHE_HWY_DISABLED_TARGETS}")
endif()
if(KVCACHE_HWY_SCALAR_ONLY)
  add_compile_definitions(HWY_COMPILE_ONLY_SCALAR)
  message(STATUS "kvcache: Highway compiles the scalar target only")
endif()

if(KVCACHE_NATIVE)
  add_compile_options(-march=native)
  message(STATUS "kvcache: building with -march=native")
endif()

# Coverage instrumentation for libFuzzer: every target, so the fuzzers see
# branches inside the library (the fuzz targets add -fsanitize=fuzzer). And
# clang's float-cast-overflow check, named explicitly (GCC's UBSan does not
# run it under -fsanitize=undefined): a float -> integer conversion out of
# range (a trace's 1e20 read into a uint32) aborts the fuzzer.
if(KVCACHE_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link -fsanitize=float-cast-overflow
    -fno-sanitize-recover=float-cast-overflow)
  add_link_options(-fsanitize=float-cast-overflow)
endif()
