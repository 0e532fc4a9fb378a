// Names of the prefetch strategies and precisions (kvcache/kernels/attention.h).

#include <array>
#include <string>
#include <utility>

#include "kvcache/error.h"
#include "kvcache/kernels/attention.h"

namespace kvcache {

namespace {

constexpr std::array<std::pair<AttentionPrefetch, std::string_view>, 5> kAttentionNames{{
    {AttentionPrefetch::automatic, "auto"},
    {AttentionPrefetch::next_step_l1, "step-l1"},
    {AttentionPrefetch::next_tile_l1, "tile-l1"},
    {AttentionPrefetch::next_tile_l2, "tile-l2"},
    {AttentionPrefetch::none, "none"},
}};

constexpr std::array<std::pair<StorePrefetch, std::string_view>, 3> kStoreNames{{
    {StorePrefetch::automatic, "auto"},
    {StorePrefetch::next_row_l1, "row-l1"},
    {StorePrefetch::none, "none"},
}};

constexpr std::array<std::pair<AttentionPrecision, std::string_view>, 2> kPrecisionNames{{
    {AttentionPrecision::fp32, "fp32"},
    {AttentionPrecision::bf16, "bf16"},
}};

template <class E, std::size_t N>
std::string_view name_of(const std::array<std::pair<E, std::string_view>, N>& names, E value) {
  for (const auto& [e, name] : names) {
    if (e == value) return name;
  }
  return "?";
}

template <class E, std::size_t N>
E parse(const std::array<std::pair<E, std::string_view>, N>& names, std::string_view name,
        const char* what) {
  std::string accepted;
  for (const auto& [e, n] : names) {
    if (n == name) return e;
    accepted += (accepted.empty() ? "" : ", ") + std::string(n);
  }
  throw InvalidArgument(std::string(what) + " '" + std::string(name) + "' is not one of " +
                        accepted);
}

}  // namespace

std::string_view prefetch_name(AttentionPrefetch p) { return name_of(kAttentionNames, p); }
std::string_view prefetch_name(StorePrefetch p) { return name_of(kStoreNames, p); }

AttentionPrefetch parse_attention_prefetch(std::string_view name) {
  return parse(kAttentionNames, name, "attention prefetch");
}

StorePrefetch parse_store_prefetch(std::string_view name) {
  return parse(kStoreNames, name, "store prefetch");
}

std::string_view precision_name(AttentionPrecision p) { return name_of(kPrecisionNames, p); }

AttentionPrecision parse_attention_precision(std::string_view name) {
  return parse(kPrecisionNames, name, "attention precision");
}

}  // namespace kvcache
