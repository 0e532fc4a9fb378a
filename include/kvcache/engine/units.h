// kvcache/engine/units.h — the one rule for sizes and counts typed by people
// (`kvcache plan --memory`, `demo --memory`, `replay --capacity`, ...).
//
// A size is a decimal number (digits with at most one '.', no sign, no
// exponent) followed, optionally after spaces, by a suffix, in any case:
//   none          x 1
//   K  M  G  T  P x 10^3, 10^6, 10^9, 10^12, 10^15   (decimal, SI)
//   Ki Mi Gi Ti Pi x 2^10, 2^20, 2^30, 2^40, 2^50    (binary, IEC)
// Byte sizes may end in "B" ("16GiB", "8GB", "512B"); counts may not.
// So "8G" and "8GB" are 8,000,000,000 bytes, "8Gi" and "8GiB" 8,589,934,592.
// The value must come out a whole number ("1.5KiB" = 1536; "1.3KiB" is
// refused) within the limit. Arithmetic is exact (no floating point): "nan",
// "inf", "-1", "1e9", ".5K" and "12parsecs" are refused.
//
// Everything here is a pure function; refusals throw kvcache::InvalidArgument
// naming the text, the reason and the limit.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvcache::engine {

// The rule above in one line, for help texts.
inline constexpr std::string_view kSizeSuffixHelp =
    "K/M/G/T = 10^3/10^6/10^9/10^12, Ki/Mi/Gi/Ti = 2^10/2^20/2^30/2^40";

// The largest byte size parse_byte_size accepts (2^62).
inline constexpr std::uint64_t kMaxByteSize = std::uint64_t{1} << 62;
// The largest token count parse_token_count accepts (2^40).
inline constexpr std::uint64_t kMaxTokenCount = std::uint64_t{1} << 40;

enum class SizeUnit : std::uint8_t { count, bytes };

// `text` under the rule above, at most `max`; `what` names the quantity in
// messages ("memory", "token count"). `unit` bytes also takes a final "B".
std::uint64_t parse_size(std::string_view text, std::string_view what, SizeUnit unit,
                         std::uint64_t max);

// A byte size in [1, kMaxByteSize]: "16GiB", "512MiB", "8G", "1.5GiB", "4096".
std::uint64_t parse_byte_size(std::string_view text);

// "unlimited" or "0" -> 0; "3000000", "512K", "1M", "1.5M", "4Mi" -> tokens,
// in [0, kMaxTokenCount].
std::uint64_t parse_token_count(std::string_view text);

}  // namespace kvcache::engine
