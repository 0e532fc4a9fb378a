// libFuzzer target for the engine's file parsers (safetensors, config.json):
// every input must parse into a well-formed result or be refused with a
// kvcache::Error. Driver: tests/reliability/parser_inputs.h.
#include <cstddef>
#include <cstdint>

#include "reliability/parser_inputs.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvcache::testing::run_parser_input({data, size});
  return 0;
}
