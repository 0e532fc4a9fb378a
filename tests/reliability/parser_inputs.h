// Feeds arbitrary bytes to the engine's file parsers (safetensors, HF
// config.json, Mooncake JSONL traces) and to `kvcache replay --capacity`'s
// token-count parser. Shared by the libFuzzer target fuzz/parsers_fuzzer.cpp
// and the regular suite (corpus replay + mutated valid files).
//
// Contract checked: a parser either returns a well-formed result (every
// tensor's data size equals the product of its shape; every trace request
// and token count within the documented limits) or throws a kvcache::Error;
// any other exception, a crash, a stack overflow or a sanitizer report
// (float-cast-overflow included) is a finding.
#pragma once

#include <cstdint>
#include <span>

namespace kvcache::testing {

// bytes[0] % 4 selects the parser (0 safetensors, 1 config.json, 2 trace
// file, 3 token count); the rest is the file content or the text. Throws
// std::logic_error on a broken contract.
void run_parser_input(std::span<const std::uint8_t> bytes);

}  // namespace kvcache::testing
