// SlabFiles: the disk tier's slot storage — files slab-00000.bin,
// slab-00001.bin ... in the tier's directory, each preallocated (fallocate)
// to slots_per_slab fixed slots of slot_bytes, created when a slot in them
// is first needed. Opened with O_DIRECT when asked and the filesystem
// allows it (an open or an aligned probe read refused with EINVAL falls back
// to buffered I/O, recorded in direct()). Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <vector>

namespace kvcache::tier {

inline constexpr std::size_t kDiskAlign = 4096;  // O_DIRECT offsets, lengths and buffers

class SlabFiles {
 public:
  SlabFiles(std::filesystem::path dir, std::uint64_t slots_per_slab, std::uint64_t slot_bytes,
            bool want_direct);
  ~SlabFiles();
  SlabFiles(const SlabFiles&) = delete;
  SlabFiles& operator=(const SlabFiles&) = delete;

  // The descriptor of slot's slab, opening it (and creating and
  // preallocating it when `create`); -errno when that fails.
  int fd_for(std::uint32_t slot, bool create);
  std::uint64_t offset_of(std::uint32_t slot) const {
    return (slot % slots_per_slab_) * slot_bytes_;
  }
  // fdatasync every slab written since the last call; false on an error.
  bool sync_dirty();
  void mark_dirty(std::uint32_t slot);
  bool direct() const;
  // Deletes every slab file in the directory (a fresh start).
  void remove_all();
  static std::filesystem::path path_of(const std::filesystem::path& dir, std::uint64_t slab);

 private:
  int open_slab(std::uint64_t slab, bool create);  // under mu_

  const std::filesystem::path dir_;
  const std::uint64_t slots_per_slab_;
  const std::uint64_t slot_bytes_;
  mutable std::mutex mu_;
  bool direct_;              // under mu_
  std::vector<int> fds_;     // under mu_; -1: not open
  std::vector<bool> dirty_;  // under mu_
};

}  // namespace kvcache::tier
