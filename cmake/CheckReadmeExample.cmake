# CheckReadmeExample.cmake — fails if README.md's C++ example is not the code of
# tools/examples/lifecycle.cpp (which the build compiles and ctest runs).
# Usage: cmake -DREADME=README.md -DEXAMPLE=tools/examples/lifecycle.cpp -P CheckReadmeExample.cmake
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "```cpp\n" start)
if(start EQUAL -1)
  message(FATAL_ERROR "${README} has no ```cpp block")
endif()
math(EXPR start "${start} + 7")
string(SUBSTRING "${readme}" ${start} -1 rest)
string(FIND "${rest}" "```" stop)
string(SUBSTRING "${rest}" 0 ${stop} block)
string(FIND "${example}" "${block}" found)
if(found EQUAL -1 OR block STREQUAL "")
  message(FATAL_ERROR "the ```cpp example in ${README} differs from ${EXAMPLE}; copy it over")
endif()
message(STATUS "README example matches ${EXAMPLE}")
