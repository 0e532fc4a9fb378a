// Overflow-checked size products for memory math (internal).
//
// Every byte, element and table size the library computes from caller
// numbers goes through checked_product: the product of named factors, or an
// InvalidArgument that names each factor and says the product passes 2^64 - 1
// (the message never prints a wrapped value).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "kvcache/error.h"

namespace kvcache::detail {

struct Factor {
  std::string_view name;
  std::uint64_t value;
};

// The product of `factors`; throws InvalidArgument naming `what` and every
// factor when it does not fit in 64 bits.
inline std::uint64_t checked_product(std::string_view what, std::initializer_list<Factor> factors) {
  std::uint64_t product = 1;
  bool overflow = false;
  for (const Factor& f : factors) overflow |= __builtin_mul_overflow(product, f.value, &product);
  if (!overflow) return product;
  std::string message(what);
  message += " = ";
  bool first = true;
  for (const Factor& f : factors) {
    if (!first) message += " * ";
    first = false;
    message.append(f.name).append(" ").append(std::to_string(f.value));
  }
  message += " does not fit in 64 bits (limit 18446744073709551615)";
  throw InvalidArgument(message);
}

}  // namespace kvcache::detail
