#include "tier/manifest.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "kvcache/error.h"

namespace kvcache::tier {

namespace {

constexpr std::uint32_t kHeaderMagic = 0x464D564B;  // "KVMF"
constexpr std::uint32_t kRecordMagic = 0x524D564B;  // "KVMR"
constexpr std::uint32_t kVersion = 1;

template <class T>
void put(std::byte* at, std::size_t& off, T v) {
  std::memcpy(at + off, &v, sizeof v);
  off += sizeof v;
}
template <class T>
T get(const std::byte* at, std::size_t& off) {
  T v;
  std::memcpy(&v, at + off, sizeof v);
  off += sizeof v;
  return v;
}

void encode_header(const ManifestGeometry& g, std::byte (&out)[kManifestHeaderBytes]) {
  std::memset(out, 0, sizeof out);
  std::size_t off = 0;
  put(out, off, kHeaderMagic);
  put(out, off, kVersion);
  put(out, off, g.digest);
  put(out, off, g.page_bytes);
  put(out, off, g.slot_bytes);
  put(out, off, g.slab_slots);
  put(out, off, g.page_size);
  const std::uint64_t sum = XXH3_64bits(out, kManifestHeaderBytes - 8);
  std::memcpy(out + kManifestHeaderBytes - 8, &sum, 8);
}

void encode_record(const ManifestRecord& r, std::byte* out) {
  std::memset(out, 0, kManifestRecordBytes);
  std::size_t off = 0;
  put(out, off, kRecordMagic);
  put(out, off, static_cast<std::uint32_t>(r.kind));
  put(out, off, std::uint64_t{r.slot});
  put(out, off, r.key.hi);
  put(out, off, r.key.lo);
  put(out, off, r.checksum);
  const std::uint64_t sum = XXH3_64bits(out, off);
  put(out, off, sum);
}

bool decode_record(const std::byte* in, ManifestRecord& r) {
  std::size_t off = 0;
  if (get<std::uint32_t>(in, off) != kRecordMagic) return false;
  const auto kind = get<std::uint32_t>(in, off);
  const auto slot = get<std::uint64_t>(in, off);
  r.key.hi = get<std::uint64_t>(in, off);
  r.key.lo = get<std::uint64_t>(in, off);
  r.checksum = get<std::uint64_t>(in, off);
  const std::uint64_t want = XXH3_64bits(in, off);
  if (get<std::uint64_t>(in, off) != want) return false;
  if (kind != 1 && kind != 2) return false;
  if (slot > 0xFFFFFFFEull) return false;
  r.kind = static_cast<ManifestRecord::Kind>(kind);
  r.slot = static_cast<std::uint32_t>(slot);
  return true;
}

bool write_all(int fd, const std::byte* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

std::string why(const std::filesystem::path& p, const char* what) {
  return "disk tier: " + std::string(what) + " " + p.string() + ": " + std::strerror(errno);
}

}  // namespace

ManifestScan scan_manifest(const std::filesystem::path& path, const ManifestGeometry& g) {
  ManifestScan scan;
  std::ifstream in(path, std::ios::binary);
  if (!in) return scan;
  std::byte head[kManifestHeaderBytes];
  if (!in.read(reinterpret_cast<char*>(head), sizeof head)) return scan;
  std::byte want[kManifestHeaderBytes];
  encode_header(g, want);
  std::size_t off = 0;
  if (get<std::uint32_t>(head, off) != kHeaderMagic) return scan;
  scan.found = true;
  scan.same_geometry = std::memcmp(head, want, sizeof head) == 0;
  if (!scan.same_geometry) return scan;
  scan.good_bytes = kManifestHeaderBytes;
  std::byte rec[kManifestRecordBytes];
  for (;;) {
    in.read(reinterpret_cast<char*>(rec), sizeof rec);
    const auto got = static_cast<std::uint64_t>(in.gcount());
    ManifestRecord r;
    if (got < sizeof rec || !decode_record(rec, r)) {
      scan.torn_bytes = got;
      break;
    }
    scan.records.push_back(r);
    scan.good_bytes += sizeof rec;
  }
  in.clear();
  in.seekg(0, std::ios::end);
  scan.torn_bytes = static_cast<std::uint64_t>(in.tellg()) - scan.good_bytes;
  return scan;
}

Manifest::Manifest(std::filesystem::path path, const ManifestGeometry& g, std::uint64_t keep_bytes)
    : path_(std::move(path)), geometry_(g) {
  if (keep_bytes == 0) {
    if (!compact({})) throw InvalidArgument(why(path_, "cannot create the manifest"));
    return;
  }
  if (::truncate(path_.c_str(), static_cast<off_t>(keep_bytes)) != 0 || !open_append()) {
    throw InvalidArgument(why(path_, "cannot open the manifest"));
  }
  records_ = (keep_bytes - kManifestHeaderBytes) / kManifestRecordBytes;
}

Manifest::~Manifest() {
  if (fd_ >= 0) {
    ::fdatasync(fd_);
    ::close(fd_);
  }
}

bool Manifest::open_append() {
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return false;
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  return true;
}

bool Manifest::append(const std::vector<ManifestRecord>& records) {
  if (records.empty()) return true;
  std::vector<std::byte> buf(records.size() * kManifestRecordBytes);
  for (std::size_t i = 0; i < records.size(); ++i) {
    encode_record(records[i], buf.data() + i * kManifestRecordBytes);
  }
  if (!write_all(fd_, buf.data(), buf.size())) return false;
  records_ += records.size();
  return true;
}

bool Manifest::compact(const std::vector<ManifestRecord>& held) {
  const std::filesystem::path tmp = path_.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  std::vector<std::byte> buf(kManifestHeaderBytes + held.size() * kManifestRecordBytes);
  std::byte head[kManifestHeaderBytes];
  encode_header(geometry_, head);
  std::memcpy(buf.data(), head, sizeof head);
  for (std::size_t i = 0; i < held.size(); ++i) {
    encode_record(held[i], buf.data() + kManifestHeaderBytes + i * kManifestRecordBytes);
  }
  const bool ok = write_all(fd, buf.data(), buf.size()) && ::fdatasync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return false;
  }
  const int dir = ::open(path_.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  if (!open_append()) return false;
  records_ = held.size();
  return true;
}

bool Manifest::sync() { return ::fdatasync(fd_) == 0; }

}  // namespace kvcache::tier
