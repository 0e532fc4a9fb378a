// Checked JSON reading shared by safetensors.cpp and trace_file.cpp.
#include "engine/json_input.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>

namespace kvcache::engine::json_input {
namespace {

// Appends c, escaped when it is a control character (and, with quotes, a
// single quote or a backslash).
void append_escaped(std::string& out, char c, bool quotes) {
  const auto u = static_cast<unsigned char>(c);
  if (u < 0x20 || u == 0x7f) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", u);
    out += buf;
  } else if (quotes && (c == '\'' || c == '\\')) {
    out += '\\';
    out += c;
  } else {
    out += c;
  }
}

// The first max bytes of text, moved back to a UTF-8 character boundary.
std::string_view cut(std::string_view text, std::size_t max) {
  if (text.size() <= max) return text;
  std::size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}

std::string escaped(std::string_view text, std::size_t max, bool quotes) {
  const std::string_view head = cut(text, max);
  std::string out;
  for (char c : head) append_escaped(out, c, quotes);
  if (head.size() < text.size()) out += "...";
  return out;
}

[[noreturn]] void too_deep() {
  throw InvalidArgument("nests arrays and objects more than " + std::to_string(kMaxJsonDepth) +
                        " levels deep (the limit)");
}

}  // namespace

json parse(std::string_view text) {
  // depth counts the arrays and objects already open around this one.
  const json::parser_callback_t limit_depth = [](int depth, json::parse_event_t event, json&) {
    const bool opens =
        event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (opens && depth >= kMaxJsonDepth) too_deep();
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), limit_depth);
  } catch (const json::exception& e) {
    throw InvalidArgument("is not valid JSON: " + bounded(e.what(), kMaxParserMessage));
  }
}

std::string printable(std::string_view text, std::size_t max) {
  return "'" + escaped(text, max, true) + "'";
}

std::string bounded(std::string_view text, std::size_t max) { return escaped(text, max, false); }

std::string excerpt(const json& v) {
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " elements";
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " members";
  if (v.is_string()) return "the string " + printable(v.get_ref<const std::string&>());
  return v.dump();  // a number, true, false or null: short
}

std::uint64_t to_uint(const json& v, const std::string& field, std::uint64_t max) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= max) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0 &&
      static_cast<std::uint64_t>(v.get<std::int64_t>()) <= max) {
    return static_cast<std::uint64_t>(v.get<std::int64_t>());
  }
  throw InvalidArgument(field + " is " + excerpt(v) + ": expected an integer in [0, " +
                        std::to_string(max) + "]");
}

double to_double(const json& v, const std::string& field, double lo, double hi) {
  const double d = v.is_number() ? v.get<double>() : std::nan("");
  if (!(d >= lo && d <= hi)) {  // false for NaN and for every non-number
    char range[64];
    std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
    throw InvalidArgument(field + " is " + excerpt(v) + ": expected a finite number in " + range);
  }
  return d;
}

std::vector<std::uint64_t> to_uint_list(const json& v, const std::string& field,
                                        std::size_t max_size, std::uint64_t max_value) {
  if (!v.is_array() || v.size() > max_size) {
    throw InvalidArgument(field + " is " + excerpt(v) + ": expected an array of at most " +
                          std::to_string(max_size) + " integers");
  }
  std::vector<std::uint64_t> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    out.push_back(to_uint(v[i], field + "[" + std::to_string(i) + "]", max_value));
  }
  return out;
}

std::string read_regular_file(const std::string& path, std::uint64_t max_bytes) {
  const std::string name = printable(path, kMaxPathEcho);
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec) throw InvalidArgument("cannot open " + name + ": " + ec.message());
  if (!std::filesystem::is_regular_file(status)) {
    throw InvalidArgument(name + " is not a regular file (a directory, device or pipe)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument("cannot open " + name + ": " + std::strerror(errno));
  std::string out;
  try {
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec) out.reserve(static_cast<std::size_t>(std::min<std::uintmax_t>(size, max_bytes)));
    char buf[1 << 16];
    while (in.read(buf, sizeof buf) || in.gcount() > 0) {
      const auto n = static_cast<std::size_t>(in.gcount());
      if (out.size() + n > max_bytes) {
        throw InvalidArgument(name + " is larger than the limit of " + std::to_string(max_bytes) +
                              " bytes");
      }
      out.append(buf, n);
    }
  } catch (const std::bad_alloc&) {
    throw OutOfMemory("no memory to read " + name + " (" + std::to_string(out.size()) +
                      " bytes read)");
  }
  if (in.bad()) throw InvalidArgument("reading " + name + " failed");
  return out;
}

}  // namespace kvcache::engine::json_input
