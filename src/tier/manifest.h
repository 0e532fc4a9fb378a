// The disk tier's manifest: an append-only file of fixed-size records,
// after a header that names the geometry it was written for.
//
//   header  (64 bytes): magic "KVMF", version, fingerprint digest, page
//           bytes, slot bytes, slots per slab file, page size, checksum
//   record  (48 bytes): magic "KVMR", kind (stored | removed), slot, key,
//           the page's checksum, the record's own checksum (XXH3-64 of the
//           40 bytes before it)
//
// A `stored` record is appended only after the slot's bytes are durable; it
// says the slot holds key (replacing what the slot held before); `removed`
// says it holds nothing. Recovery replays the records in order and stops
// at the first one that is torn or fails its checksum: that tail is
// truncated away. Compaction rewrites the file as the header plus one
// `stored` record per page held (a temporary file, fsync, rename, fsync of
// the directory), so a crash leaves the old or the new manifest whole.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kvcache/tier.h"

namespace kvcache::tier {

struct ManifestGeometry {
  std::uint64_t digest = 0;
  std::uint64_t page_bytes = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t slab_slots = 0;
  std::uint32_t page_size = 0;
  friend bool operator==(const ManifestGeometry&, const ManifestGeometry&) = default;
};

struct ManifestRecord {
  enum class Kind : std::uint8_t { stored = 1, removed = 2 };
  Kind kind = Kind::stored;
  std::uint32_t slot = 0;
  PageKey key;
  std::uint64_t checksum = 0;
};

inline constexpr std::size_t kManifestHeaderBytes = 64;
inline constexpr std::size_t kManifestRecordBytes = 48;

// What recovery found in an existing manifest.
struct ManifestScan {
  bool found = false;                   // a whole header was there
  bool same_geometry = false;           // ... and it names this geometry
  std::vector<ManifestRecord> records;  // the good records, in order
  std::uint64_t good_bytes = 0;         // header + good records
  std::uint64_t torn_bytes = 0;         // ignored after them
};

// Reads path (missing: found false). Throws nothing for bad content.
ManifestScan scan_manifest(const std::filesystem::path& path, const ManifestGeometry& g);

// The open manifest: appends records (buffered writes, one write a batch).
class Manifest {
 public:
  // Opens path for appending after `keep_bytes` (truncating a torn tail), or
  // creates it with a fresh header when keep_bytes is 0. Throws
  // InvalidArgument naming the path and the system's reason.
  Manifest(std::filesystem::path path, const ManifestGeometry& g, std::uint64_t keep_bytes);
  ~Manifest();
  Manifest(const Manifest&) = delete;
  Manifest& operator=(const Manifest&) = delete;

  // Appends the records in one write; false on an I/O error (errno kept).
  bool append(const std::vector<ManifestRecord>& records);
  // Rewrites the manifest as `held` (stored records); false on an error (the
  // old manifest stays in place and open).
  bool compact(const std::vector<ManifestRecord>& held);
  // fdatasync; false on error.
  bool sync();
  std::uint64_t records() const { return records_; }

 private:
  bool open_append();
  std::filesystem::path path_;
  ManifestGeometry geometry_;
  int fd_ = -1;
  std::uint64_t records_ = 0;
};

}  // namespace kvcache::tier
