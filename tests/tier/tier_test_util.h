// Helpers of the tier tests: a fingerprint, pages of random bytes with their
// chained keys, and a temporary directory removed afterwards.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kvcache/tier.h"

namespace kvcache::tier_test {

// page_bytes() = 2 * 2 layers * 16 tokens * 2 heads * head_dim * 2 bytes.
inline TierFingerprint fingerprint(std::uint32_t head_dim = 64, std::string model = "m") {
  TierFingerprint f;
  f.dtype = DType::bf16;
  f.page_size = 16;
  f.n_kv_heads = 2;
  f.head_dim = head_dim;
  f.layer_begin = 0;
  f.layer_end = 2;
  f.model_id = std::move(model);
  return f;
}

// n pages of one token chain: random tokens and random bytes (no zero byte).
struct Pages {
  std::vector<PageKey> keys;
  std::vector<std::vector<std::uint32_t>> tokens;
  std::vector<std::vector<std::byte>> bytes;

  Pages(const TierFingerprint& f, std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    PageKey parent{};
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<std::uint32_t> t(f.page_size);
      for (auto& x : t) x = rng() % 50000;
      std::vector<std::byte> b(f.page_bytes());
      for (auto& x : b) x = static_cast<std::byte>(1 + rng() % 255);
      parent = page_key(parent, t, f.digest());
      keys.push_back(parent);
      tokens.push_back(std::move(t));
      bytes.push_back(std::move(b));
    }
  }
  PageWrite write(std::size_t i) const { return {keys[i], tokens[i], bytes[i]}; }
  std::vector<PageWrite> writes(std::size_t from, std::size_t to) const {
    std::vector<PageWrite> w;
    for (std::size_t i = from; i < to; ++i) w.push_back(write(i));
    return w;
  }
  std::vector<PageWrite> writes() const { return writes(0, keys.size()); }
};

// Buffers to load pages into (filled with 0xEE so stale bytes show).
struct ReadBuffers {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<PageRead> reads;
  ReadBuffers(const Pages& p, std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) {
      bytes.emplace_back(p.bytes[i].size(), std::byte{0xEE});
    }
    for (std::size_t i = from; i < to; ++i) {
      reads.push_back({p.keys[i], p.tokens[i], bytes[i - from]});
    }
  }
};

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "kvcache-tier-XXXXXX").string();
    if (mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

template <class R>
std::vector<R> results(std::span<const R> r) {
  return std::vector<R>(r.begin(), r.end());
}

}  // namespace kvcache::tier_test
