# KvcacheInstall.cmake — `cmake --install <build> [--prefix P]` (KVCACHE_INSTALL).
#
# Installs, under the prefix:
#   include/kvcache/**                      the public headers (engine/ with the engine,
#                                           cuda/ with the CUDA backend only) and the
#                                           generated kvcache/version.h
#   lib/libkvcache.a, lib/libkvcache_replay.a, lib/libkvcache_engine.a
#   lib/libkvcache_c.so*                    the C interface alone, as a shared library
#   lib/cmake/kvcache/                      the CMake package: find_package(kvcache CONFIG)
#                                           gives kvcache::kvcache, kvcache::replay (and kvcache::c,
#                                           kvcache::engine, kvcache::cuda where built)
#   lib/pkgconfig/kvcache.pc, kvcache-c.pc  for other build systems (cargo, meson, make)
#   bin/kvcache                             the command line, where it was built
#   share/doc/kvcache/LICENSE, CHANGELOG.md
# Both package files locate the prefix from their own path, so the installed
# tree can be moved. docs/embedding.md shows each way in.

include(CMakePackageConfigHelpers)
set(KVCACHE_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/kvcache")

set(_kvcache_header_excludes)
if(NOT TARGET kvcache_engine)
  list(APPEND _kvcache_header_excludes PATTERN "engine" EXCLUDE)
endif()
if(NOT TARGET kvcache_cuda)
  list(APPEND _kvcache_header_excludes PATTERN "cuda" EXCLUDE)
endif()
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/kvcache"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT devel
  FILES_MATCHING PATTERN "*.h" ${_kvcache_header_excludes})
install(FILES "${KVCACHE_GENERATED_INCLUDE_DIR}/kvcache/version.h"  # configured from version.h.in
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/kvcache" COMPONENT devel)
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" "${PROJECT_SOURCE_DIR}/CHANGELOG.md"
  DESTINATION "${CMAKE_INSTALL_DOCDIR}" COMPONENT devel)

set(_kvcache_exported kvcache kvcache_replay)
foreach(_target kvcache_c kvcache_engine kvcache_cuda)
  if(TARGET ${_target})
    list(APPEND _kvcache_exported ${_target})
  endif()
endforeach()
if(TARGET kvcache_cuda)
  set_target_properties(kvcache_cuda PROPERTIES EXPORT_NAME cuda)
endif()
install(TARGETS ${_kvcache_exported} EXPORT kvcacheTargets
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT devel
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT devel
  INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(EXPORT kvcacheTargets NAMESPACE kvcache:: DESTINATION "${KVCACHE_CMAKE_DIR}"
  COMPONENT devel)

# Included last in CMakeLists.txt, so every target that exists is defined.
set(KVCACHE_PACKAGE_HAS_C OFF)
if(TARGET kvcache_c)
  set(KVCACHE_PACKAGE_HAS_C ON)
endif()
set(KVCACHE_PACKAGE_HAS_ENGINE OFF)
set(KVCACHE_PACKAGE_HAS_CUDA OFF)
if(TARGET kvcache_engine)
  set(KVCACHE_PACKAGE_HAS_ENGINE ON)
endif()
if(TARGET kvcache_cuda)
  set(KVCACHE_PACKAGE_HAS_CUDA ON)
endif()
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/kvcacheConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/kvcacheConfig.cmake" INSTALL_DESTINATION "${KVCACHE_CMAKE_DIR}")
# 0.x: a minor version may break the interface, so only the same minor matches.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/kvcacheConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/kvcacheConfig.cmake"
  "${PROJECT_BINARY_DIR}/kvcacheConfigVersion.cmake"
  DESTINATION "${KVCACHE_CMAKE_DIR}" COMPONENT devel)

# pkg-config: one static library, so its dependencies go in Libs / Requires
# (a plain `pkg-config --libs kvcache` links). The prefix is found from the
# .pc file's own folder.
file(RELATIVE_PATH KVCACHE_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" KVCACHE_PC_TO_PREFIX "${KVCACHE_PC_TO_PREFIX}")
configure_file("${PROJECT_SOURCE_DIR}/cmake/kvcache.pc.in" "${PROJECT_BINARY_DIR}/kvcache.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/kvcache.pc"
  DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig" COMPONENT devel)
if(TARGET kvcache_c)
  configure_file("${PROJECT_SOURCE_DIR}/cmake/kvcache-c.pc.in" "${PROJECT_BINARY_DIR}/kvcache-c.pc" @ONLY)
  install(FILES "${PROJECT_BINARY_DIR}/kvcache-c.pc"
    DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig" COMPONENT devel)
endif()

if(TARGET kvcache_cli)
  install(TARGETS kvcache_cli RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT tools)
endif()
