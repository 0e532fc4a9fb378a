// Checked reading of the engine's JSON inputs (config.json, safetensors
// headers, trace lines) and of the files that hold them.
//
// Everything here refuses bad input with kvcache::InvalidArgument and never
// recurses per level of the input: parse() refuses nesting deeper than
// kMaxJsonDepth before it is built (so no later dump() or copy can overflow
// the stack), numbers convert only when they are integers in range (never an
// undefined float -> int conversion), and a value echoed in a message is
// described in at most about kMaxEcho bytes (a 3-million-element array is "an
// array of 3000000 elements", a long string is cut, control characters such
// as NUL are escaped so the message is not cut short). Messages carry no file
// name: the callers prefix theirs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/error.h"

namespace kvcache::engine::json_input {

using json = nlohmann::json;

// Deepest nesting of arrays and objects accepted (config.json and
// safetensors headers need 3 or 4 levels).
inline constexpr int kMaxJsonDepth = 64;
// Bytes of a string value or name echoed in a message before it is cut.
inline constexpr std::size_t kMaxEcho = 64;
// Bytes of a JSON parser's own message kept (its "last read" can be long).
inline constexpr std::size_t kMaxParserMessage = 256;

// Parses text; InvalidArgument "is not valid JSON: ..." (the parser's
// message, bounded and escaped) or "nests arrays/objects deeper than 64 levels".
json parse(std::string_view text);

// Bytes of a file path echoed in a message (PATH_MAX).
inline constexpr std::size_t kMaxPathEcho = 4096;

// 'text' with control characters, quote and backslash escaped (\u0000 ...)
// and cut to max bytes (at a UTF-8 character boundary, then "...").
std::string printable(std::string_view text, std::size_t max = kMaxEcho);

// Text cut to max bytes ("..." appended) with control characters escaped.
std::string bounded(std::string_view text, std::size_t max);

// A short description of a value for a message: a number, bool or null as
// written, a string printable(), an array or object by its size.
std::string excerpt(const json& v);

// The JSON integer v (unsigned or non-negative signed: 1.0, 1.5, -1, 1e20
// and strings are refused) if it is at most max. InvalidArgument naming
// field, excerpt(v) and the range otherwise.
std::uint64_t to_uint(const json& v, const std::string& field, std::uint64_t max);

template <class U>
U to_uint(const json& v, const std::string& field) {
  return static_cast<U>(to_uint(v, field, std::numeric_limits<U>::max()));
}

// A JSON number that is finite and within [lo, hi] (integers included).
double to_double(const json& v, const std::string& field, double lo, double hi);

// An array of at most max_size integers, each as to_uint(..., max_value).
std::vector<std::uint64_t> to_uint_list(const json& v, const std::string& field,
                                        std::size_t max_size, std::uint64_t max_value);

// The bytes of a regular file of at most max_bytes. InvalidArgument naming
// the path when it cannot be opened, is not a regular file (a directory, a
// device such as /dev/zero, a pipe), is larger than max_bytes, or a read fails.
std::string read_regular_file(const std::string& path, std::uint64_t max_bytes);

}  // namespace kvcache::engine::json_input
