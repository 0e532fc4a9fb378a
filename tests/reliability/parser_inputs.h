// Feeds arbitrary bytes to the engine's file parsers (safetensors, HF
// config.json). Shared by the libFuzzer target fuzz/parsers_fuzzer.cpp and
// the regular suite (corpus replay + mutated valid files).
//
// Contract checked: a parser either returns a well-formed result (every
// tensor's data size equals the product of its shape) or throws a
// kvcache::Error; any other exception or a crash is a finding.
#pragma once

#include <cstdint>
#include <span>

namespace kvcache::testing {

// bytes[0] selects the parser (even: safetensors, odd: config.json); the
// rest is the file content. Throws std::logic_error on a broken contract.
void run_parser_input(std::span<const std::uint8_t> bytes);

}  // namespace kvcache::testing
