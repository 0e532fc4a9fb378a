#include "tier/slab_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace kvcache::tier {

SlabFiles::SlabFiles(std::filesystem::path dir, std::uint64_t slots_per_slab,
                     std::uint64_t slot_bytes, bool want_direct)
    : dir_(std::move(dir)),
      slots_per_slab_(slots_per_slab),
      slot_bytes_(slot_bytes),
      direct_(want_direct) {}

SlabFiles::~SlabFiles() {
  for (const int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

std::filesystem::path SlabFiles::path_of(const std::filesystem::path& dir, std::uint64_t slab) {
  char name[32];
  std::snprintf(name, sizeof name, "slab-%05llu.bin", static_cast<unsigned long long>(slab));
  return dir / name;
}

namespace {

// An aligned O_DIRECT read of the first block: EINVAL means the filesystem
// takes the flag at open but not at I/O.
bool direct_read_works(int fd) {
  void* buf = std::aligned_alloc(kDiskAlign, kDiskAlign);
  if (buf == nullptr) return true;
  const ssize_t n = ::pread(fd, buf, kDiskAlign, 0);
  const bool refused = n < 0 && errno == EINVAL;
  std::free(buf);
  return !refused;
}

int preallocate(int fd, std::uint64_t bytes) {
  struct stat s {};
  if (::fstat(fd, &s) == 0 && static_cast<std::uint64_t>(s.st_size) >= bytes) return 0;
  if (::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0) return 0;
  if (errno != EOPNOTSUPP) return -errno;
  return ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : -errno;  // no fallocate here
}

}  // namespace

int SlabFiles::open_slab(std::uint64_t slab, bool create) {
  const std::filesystem::path p = path_of(dir_, slab);
  const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0);
  int fd = direct_ ? ::open(p.c_str(), flags | O_DIRECT, 0644) : -1;
  if (direct_ && fd < 0 && errno == EINVAL) direct_ = false;  // the filesystem refuses O_DIRECT
  if (fd < 0 && !direct_) fd = ::open(p.c_str(), flags, 0644);
  if (fd < 0) return -errno;
  if (create) {
    const int e = preallocate(fd, slots_per_slab_ * slot_bytes_);
    if (e < 0) {
      ::close(fd);
      return e;
    }
  }
  if (direct_ && !direct_read_works(fd)) {
    direct_ = false;
    ::close(fd);
    for (int& other : fds_) {  // reopen the others buffered too
      if (other >= 0) ::close(other);
      other = -1;
    }
    return open_slab(slab, create);
  }
  return fd;
}

int SlabFiles::fd_for(std::uint32_t slot, bool create) {
  const std::uint64_t slab = slot / slots_per_slab_;
  std::lock_guard lock(mu_);
  if (slab >= fds_.size()) {
    fds_.resize(slab + 1, -1);
    dirty_.resize(slab + 1, false);
  }
  if (fds_[slab] < 0) {
    const int fd = open_slab(slab, create);
    if (fd < 0) return fd;
    fds_[slab] = fd;
  }
  return fds_[slab];
}

void SlabFiles::mark_dirty(std::uint32_t slot) {
  std::lock_guard lock(mu_);
  const std::uint64_t slab = slot / slots_per_slab_;
  if (slab < dirty_.size()) dirty_[slab] = true;
}

bool SlabFiles::sync_dirty() {
  std::vector<int> fds;
  {
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < dirty_.size(); ++i) {
      if (dirty_[i] && fds_[i] >= 0) fds.push_back(fds_[i]);
      dirty_[i] = false;
    }
  }
  bool ok = true;
  for (const int fd : fds) ok = ::fdatasync(fd) == 0 && ok;
  return ok;
}

bool SlabFiles::direct() const {
  std::lock_guard lock(mu_);
  return direct_;
}

void SlabFiles::remove_all() {
  std::lock_guard lock(mu_);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("slab-", 0) == 0 && entry.path().extension() == ".bin") {
      std::filesystem::remove(entry.path(), ec);
    }
  }
}

}  // namespace kvcache::tier
