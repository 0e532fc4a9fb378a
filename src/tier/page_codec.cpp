#include "tier/page_codec.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "kvcache/error.h"

namespace kvcache::tier {

namespace {
constexpr std::size_t kCopyChunk = std::size_t{64} << 10;  // fits L2 with room to spare
constexpr std::size_t kChecksumOffset = offsetof(PageHeader, checksum);
}  // namespace

Checksum::Checksum() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw OutOfMemory("XXH3 state for a page checksum");
  XXH3_64bits_reset(state_);
}

Checksum::~Checksum() { XXH3_freeState(state_); }

void Checksum::update(const void* data, std::size_t n) { XXH3_64bits_update(state_, data, n); }

std::uint64_t Checksum::digest() const { return XXH3_64bits_digest(state_); }

void copy_and_hash(std::byte* dst, const std::byte* src, std::size_t n, Checksum& sum) {
  for (std::size_t off = 0; off < n; off += kCopyChunk) {
    const std::size_t len = std::min(kCopyChunk, n - off);
    std::memcpy(dst + off, src + off, len);
    sum.update(dst + off, len);
  }
}

void write_meta(std::span<std::byte> meta, std::uint64_t digest, PageKey key,
                std::span<const std::uint32_t> tokens, std::uint64_t page_bytes, Checksum& sum) {
  PageHeader h;
  h.fingerprint = digest;
  h.key = key;
  h.num_tokens = static_cast<std::uint32_t>(tokens.size());
  h.page_bytes = page_bytes;
  h.checksum = 0;
  std::memcpy(meta.data(), &h, sizeof h);
  std::memcpy(meta.data() + sizeof h, tokens.data(), tokens.size_bytes());
  const std::size_t used = sizeof h + tokens.size_bytes();
  std::memset(meta.data() + used, 0, meta.size() - used);
  sum.update(meta.data(), used);
}

std::uint64_t seal(std::span<std::byte> meta, const Checksum& sum) {
  const std::uint64_t c = sum.digest();
  std::memcpy(meta.data() + kChecksumOffset, &c, sizeof c);
  return c;
}

PageHeader read_header(std::span<const std::byte> meta) {
  PageHeader h;
  std::memcpy(&h, meta.data(), sizeof h);
  return h;
}

bool header_well_formed(const PageHeader& h, PageKey key, std::uint32_t page_size,
                        std::uint64_t page_bytes) {
  return h.magic == PageHeader::kMagic && h.version == PageHeader::kVersion && h.key == key &&
         h.num_tokens == page_size && h.page_bytes == page_bytes;
}

void hash_meta(std::span<const std::byte> meta, std::uint32_t page_size, Checksum& sum) {
  std::byte head[sizeof(PageHeader)];
  std::memcpy(head, meta.data(), sizeof head);
  std::memset(head + kChecksumOffset, 0, sizeof(std::uint64_t));
  sum.update(head, sizeof head);
  sum.update(meta.data() + sizeof head, std::size_t{page_size} * sizeof(std::uint32_t));
}

bool identity_matches(std::span<const std::byte> meta, std::uint64_t digest,
                      std::span<const std::uint32_t> tokens) {
  return read_header(meta).fingerprint == digest &&
         std::memcmp(meta.data() + sizeof(PageHeader), tokens.data(), tokens.size_bytes()) == 0;
}

namespace {
template <class Page>
void check_pages(std::span<const Page> pages, std::uint32_t page_size, std::size_t page_bytes,
                 std::string_view tier, const char* what) {
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (pages[i].token_ids.size() != page_size) {
      throw InvalidArgument(std::string(tier) + " tier " + what + ": page " + std::to_string(i) +
                            " has " + std::to_string(pages[i].token_ids.size()) +
                            " token ids, the page size is " + std::to_string(page_size));
    }
    if (pages[i].bytes.size() != page_bytes) {
      throw InvalidArgument(std::string(tier) + " tier " + what + ": page " + std::to_string(i) +
                            " has a buffer of " + std::to_string(pages[i].bytes.size()) +
                            " bytes, a page is " + std::to_string(page_bytes));
    }
  }
}
}  // namespace

void check_writes(std::span<const PageWrite> pages, std::uint32_t page_size, std::size_t page_bytes,
                  std::string_view tier) {
  check_pages(pages, page_size, page_bytes, tier, "store");
}

void check_reads(std::span<const PageRead> pages, std::uint32_t page_size, std::size_t page_bytes,
                 std::string_view tier) {
  check_pages(pages, page_size, page_bytes, tier, "load");
}

}  // namespace kvcache::tier
