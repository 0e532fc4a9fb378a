#include "kvcache/dtype.h"

#include <array>
#include <cctype>
#include <string>
#include <utility>

#include "kvcache/error.h"

namespace kvcache {
namespace {

// Every spelling parse_dtype takes (compared lower-cased).
constexpr std::array<std::pair<std::string_view, DType>, 19> kDTypeAliases{{
    {"f32", DType::f32},
    {"fp32", DType::f32},
    {"float32", DType::f32},
    {"float", DType::f32},
    {"f16", DType::f16},
    {"fp16", DType::f16},
    {"float16", DType::f16},
    {"half", DType::f16},
    {"bf16", DType::bf16},
    {"bfloat16", DType::bf16},
    {"fp8_e4m3", DType::fp8_e4m3},
    {"fp8", DType::fp8_e4m3},
    {"e4m3", DType::fp8_e4m3},
    {"float8_e4m3fn", DType::fp8_e4m3},
    {"fp8_e5m2", DType::fp8_e5m2},
    {"e5m2", DType::fp8_e5m2},
    {"float8_e5m2", DType::fp8_e5m2},
    {"int8", DType::int8},
    {"i8", DType::int8},
}};

}  // namespace

DType parse_dtype(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& [alias, type] : kDTypeAliases) {
    if (lower == alias) return type;
  }
  throw InvalidArgument("unknown dtype '" + std::string(name) + "': expected " +
                        std::string(kDTypeNames));
}

}  // namespace kvcache
