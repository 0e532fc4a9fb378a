// Mooncake JSONL traces, read with every number checked (kvcache/engine/trace_file.h).
#include "kvcache/engine/trace_file.h"

#include <algorithm>
#include <fstream>
#include <ios>

#include "engine/json_input.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

using json_input::json;

const json& member(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end()) throw InvalidArgument(std::string("no ") + key + " member");
  return *it;
}

// Reads the next line (without its '\n') into `line`; false when the input
// is exhausted. A line longer than kMaxTraceLineBytes is refused before it is
// stored whole, so a file without newlines (/dev/zero) costs 1 MiB.
bool next_line(std::streambuf& in, std::string& line) {
  line.clear();
  for (int c = in.sbumpc(); c != std::char_traits<char>::eof(); c = in.sbumpc()) {
    if (c == '\n') return true;
    if (line.size() == kMaxTraceLineBytes) {
      throw InvalidArgument("the line is longer than the limit of " +
                            std::to_string(kMaxTraceLineBytes) + " bytes");
    }
    line.push_back(static_cast<char>(c));
  }
  return !line.empty();
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

// "<path>:<line>: " + what, or "<path>: " + what for line 0.
[[noreturn]] void fail_at(const std::string& path, std::size_t line, const std::string& what) {
  std::string where = "trace " + json_input::printable(path, json_input::kMaxPathEcho);
  if (line != 0) where += ":" + std::to_string(line);
  throw InvalidArgument(where + ": " + what);
}

}  // namespace

TraceRequest parse_trace_line(std::string_view line) {
  const json j = json_input::parse(line);
  if (!j.is_object())
    throw InvalidArgument("the line is " + json_input::excerpt(j) + ", not an object");
  TraceRequest r;
  r.timestamp_ms =
      json_input::to_double(member(j, "timestamp"), "timestamp", 0, kMaxTraceTimestampMs);
  r.input_length = static_cast<std::uint32_t>(
      json_input::to_uint(member(j, "input_length"), "input_length", kMaxTraceRequestTokens));
  r.output_length = static_cast<std::uint32_t>(
      json_input::to_uint(member(j, "output_length"), "output_length", kMaxTraceRequestTokens));
  r.hash_ids =
      json_input::to_uint_list(member(j, "hash_ids"), "hash_ids", kMaxTraceHashIds, UINT64_MAX);
  return r;
}

void for_each_trace_request(const std::string& path,
                            const std::function<bool(TraceRequest&&, std::size_t)>& fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_at(path, 0, "cannot be opened");
  std::string line;
  std::size_t line_no = 0, requests = 0;
  try {
    for (;;) {
      ++line_no;
      if (!next_line(*in.rdbuf(), line)) break;
      if (blank(line)) continue;
      ++requests;
      if (!fn(parse_trace_line(line), line_no)) return;
    }
  } catch (const std::ios_base::failure& e) {  // a directory, an I/O error
    fail_at(path, 0, std::string("reading failed: ") + e.what());
  } catch (const InvalidArgument& e) {
    fail_at(path, line_no, e.what());
  }
  if (requests == 0) fail_at(path, 0, "holds no requests");
}

std::vector<TraceRequest> read_mooncake_trace(const std::string& path) {
  std::vector<TraceRequest> trace;
  for_each_trace_request(path, [&](TraceRequest&& r, std::size_t) {
    trace.push_back(std::move(r));
    return true;
  });
  return trace;
}

}  // namespace kvcache::engine
