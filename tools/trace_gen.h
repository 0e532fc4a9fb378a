// tools/trace_gen.h — `kvcache trace-gen`'s writer, for the tests.
#pragma once

#include <ostream>
#include <span>

#include "kvcache/replay/trace.h"

namespace kvcache::tools {

// One JSON object a line ({"timestamp", "input_length", "output_length",
// "hash_ids"}), as engine::read_mooncake_trace reads it back.
void write_trace_jsonl(std::ostream& out, std::span<const TraceRequest> trace);

}  // namespace kvcache::tools
