// Sizes and counts typed by people, under one rule (kvcache/engine/units.h).
#include "kvcache/engine/units.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "engine/json_input.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

using u128 = unsigned __int128;

// Digits after the point that can still give a whole number (10^19 < 2^64).
constexpr std::size_t kMaxFractionDigits = 19;

[[noreturn]] void bad_size(std::string_view text, std::string_view what, SizeUnit unit,
                           std::uint64_t max, const std::string& why) {
  const char* examples =
      unit == SizeUnit::bytes ? "16GiB, 512MiB, 8GB, 1.5GiB, 4096" : "1M, 3000000, 512K, 1.5M, 4Mi";
  throw InvalidArgument(std::string(what) + " " + json_input::printable(text) + " " + why + " (" +
                        std::string(kSizeSuffixHelp) + "; examples: " + examples + "; at most " +
                        std::to_string(max) + ")");
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The multiplier of a suffix (already lower-cased), 0 if it is not one.
std::uint64_t multiplier(std::string suffix, SizeUnit unit) {
  if (unit == SizeUnit::bytes && !suffix.empty() && suffix.back() == 'b') suffix.pop_back();
  if (suffix.empty()) return 1;
  static constexpr std::string_view kPrefixes = "kmgtp";
  const std::size_t power = kPrefixes.find(suffix[0]);
  if (power == std::string_view::npos) return 0;
  const std::string_view rest = std::string_view(suffix).substr(1);
  if (!rest.empty() && rest != "i") return 0;
  const std::uint64_t base = rest.empty() ? 1000 : 1024;
  std::uint64_t m = base;
  for (std::size_t i = 0; i < power; ++i) m *= base;
  return m;
}

}  // namespace

std::uint64_t parse_size(std::string_view text, std::string_view what, SizeUnit unit,
                         std::uint64_t max) {
  const std::size_t digits = std::min(text.find_first_not_of("0123456789."), text.size());
  const std::string_view number = text.substr(0, digits);
  std::string_view suffix = text.substr(digits);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  if (number.empty()) bad_size(text, what, unit, max, "does not start with a digit");
  const std::uint64_t scale = multiplier(lower(suffix), unit);
  if (scale == 0) {
    bad_size(text, what, unit, max, "has an unknown suffix " + json_input::printable(suffix));
  }
  const std::size_t dot = std::min(number.find('.'), number.size());
  const std::string_view whole = number.substr(0, dot);
  std::string_view fraction = dot < number.size() ? number.substr(dot + 1) : "";
  if (whole.empty() || fraction.find('.') != std::string_view::npos) {
    bad_size(text, what, unit, max, "is not a number");
  }
  while (!fraction.empty() && fraction.back() == '0') fraction.remove_suffix(1);
  if (fraction.size() > kMaxFractionDigits) {
    bad_size(text, what, unit, max, "is not a whole number");
  }
  // Exact: whole * scale + fraction * scale / 10^digits, all in 128 bits.
  u128 value = 0;
  for (char c : whole) {
    value = value * 10 + static_cast<unsigned>(c - '0');
    if (value > max) bad_size(text, what, unit, max, "is too large");
  }
  value *= scale;
  u128 numerator = 0, denominator = 1;
  for (char c : fraction) {
    numerator = numerator * 10 + static_cast<unsigned>(c - '0');
    denominator *= 10;
  }
  numerator *= scale;  // < 10^19 * 2^50: fits
  if (numerator % denominator != 0) bad_size(text, what, unit, max, "is not a whole number");
  value += numerator / denominator;
  if (value > max) bad_size(text, what, unit, max, "is too large");
  return static_cast<std::uint64_t>(value);
}

std::uint64_t parse_byte_size(std::string_view text) {
  const std::uint64_t bytes = parse_size(text, "memory", SizeUnit::bytes, kMaxByteSize);
  if (bytes == 0) {
    throw InvalidArgument("memory " + json_input::printable(text) + " must be at least 1 byte");
  }
  return bytes;
}

std::uint64_t parse_token_count(std::string_view text) {
  if (text == "unlimited") return 0;
  return parse_size(text, "token count", SizeUnit::count, kMaxTokenCount);
}

}  // namespace kvcache::engine
