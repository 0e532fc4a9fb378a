// The stored form of a page, shared by every tier: a meta block (PageHeader,
// then the page's token ids, then zeros up to the block's size) and the page
// bytes. The checksum (XXH3-64) runs over the header with its checksum field
// zero, the token ids and the page bytes (kvcache/tier.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvcache/tier.h"

struct XXH3_state_s;

namespace kvcache::tier {

constexpr std::size_t round_up(std::size_t n, std::size_t align) {
  return (n + align - 1) / align * align;
}

// Header plus token ids.
constexpr std::size_t meta_used_bytes(std::uint32_t page_size) {
  return sizeof(PageHeader) + std::size_t{page_size} * sizeof(std::uint32_t);
}

// XXH3-64, fed piece by piece (RAII over the xxHash state).
class Checksum {
 public:
  Checksum();
  ~Checksum();
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;
  void update(const void* data, std::size_t n);
  std::uint64_t digest() const;

 private:
  XXH3_state_s* state_;
};

// memcpy of n bytes, feeding each chunk of dst to `sum` while it is still in
// cache: one pass over memory for copy and checksum.
void copy_and_hash(std::byte* dst, const std::byte* src, std::size_t n, Checksum& sum);

// Writes the header for (digest, key, tokens, page_bytes) and the token ids
// into meta (at least meta_used_bytes(tokens.size()); the rest up to its end
// is zeroed) and starts `sum` over them. The checksum field stays zero until
// seal().
void write_meta(std::span<std::byte> meta, std::uint64_t digest, PageKey key,
                std::span<const std::uint32_t> tokens, std::uint64_t page_bytes, Checksum& sum);
// Stores the finished checksum into the header of meta; returns it.
std::uint64_t seal(std::span<std::byte> meta, const Checksum& sum);

// The header of a meta block (copied out; meta may be unaligned).
PageHeader read_header(std::span<const std::byte> meta);

// Whether a read-back meta block is a well-formed header for `key` with
// `page_size` tokens and `page_bytes` bytes (magic, version, key, sizes):
// false means the slot holds something else or garbage (corrupt).
bool header_well_formed(const PageHeader& h, PageKey key, std::uint32_t page_size,
                        std::uint64_t page_bytes);
// Feeds the meta block's header (checksum field zero) and token ids to sum.
void hash_meta(std::span<const std::byte> meta, std::uint32_t page_size, Checksum& sum);
// Whether the page is the caller's: same fingerprint digest and token ids
// (false: mismatch).
bool identity_matches(std::span<const std::byte> meta, std::uint64_t digest,
                      std::span<const std::uint32_t> tokens);

// Throws InvalidArgument, naming the page and the sizes, unless every page
// has `page_size` token ids and `page_bytes` bytes.
void check_writes(std::span<const PageWrite> pages, std::uint32_t page_size, std::size_t page_bytes,
                  std::string_view tier);
void check_reads(std::span<const PageRead> pages, std::uint32_t page_size, std::size_t page_bytes,
                 std::string_view tier);

// Hash of a PageKey for unordered containers.
struct PageKeyHash {
  std::size_t operator()(const PageKey& k) const noexcept {
    return static_cast<std::size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull));
  }
};

}  // namespace kvcache::tier
