#include "kvcache/dtype.h"

#include <string>

#include "kvcache/error.h"

namespace kvcache {

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "f16" || name == "float16") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  throw InvalidArgument("unknown dtype '" + std::string(name) + "': expected f32, f16 or bf16");
}

}  // namespace kvcache
