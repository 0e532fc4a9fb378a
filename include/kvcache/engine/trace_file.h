// kvcache/engine/trace_file.h — Mooncake-format JSONL traces read with every
// number checked (`kvcache replay --trace`, `kvcache demo --trace`). The
// token counts `kvcache replay --capacity` takes are read by parse_token_count
// (kvcache/engine/units.h, included here).
//
// One JSON object a line, other members ignored, blank lines skipped:
//   {"timestamp": 27482, "input_length": 6955, "output_length": 52,
//    "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]}
// Checked before anything is sized by it:
//   timestamp      a finite number of ms in [0, kMaxTraceTimestampMs]
//   input_length   a JSON integer in [0, kMaxTraceRequestTokens] (kvcache/replay/trace.h)
//   output_length  a JSON integer in [0, kMaxTraceRequestTokens]
//   hash_ids       an array of at most kMaxTraceHashIds JSON integers in [0, 2^64 - 1]
//   a line         at most kMaxTraceLineBytes bytes, arrays / objects nested
//                  at most 64 levels
// A fraction (600.7), a negative, a number past the range (4294967897, 1e20)
// or a string is refused, never truncated, wrapped or converted. Refusals are
// InvalidArgument naming the file, the line, the field, the value and the
// limit; so are a path that cannot be opened or read (a directory), a line
// that never ends (/dev/zero) and a trace with no request. Whether
// input_length fits the hash ids is checked where the trace is used
// (replay_trace; the demo's loader pads or cuts prompts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/engine/units.h"  // parse_token_count, kMaxTokenCount
#include "kvcache/replay/trace.h"

namespace kvcache::engine {

inline constexpr std::size_t kMaxTraceLineBytes = std::size_t{1} << 20;
inline constexpr double kMaxTraceTimestampMs = 9007199254740992.0;  // 2^53: exact integers

// One line's request; messages name the field but no file or line.
TraceRequest parse_trace_line(std::string_view line);

// Calls fn(request, line number) for every request of the file, in order,
// until fn returns false. Throws as described above (an empty trace is
// refused only if fn never returned false).
void for_each_trace_request(const std::string& path,
                            const std::function<bool(TraceRequest&&, std::size_t line)>& fn);

// Every request of the file.
std::vector<TraceRequest> read_mooncake_trace(const std::string& path);

}  // namespace kvcache::engine
