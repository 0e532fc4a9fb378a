// IoBackend: how the disk tier moves a slot's bytes — io_uring (one ring, a
// reaper thread) or blocking preadv/pwritev on the tier's worker threads.
//
// submit() hands one vectored read or write to the backend and returns; the
// completion runs `done(result)` on one of the tier's TierWorkers threads,
// where result is the bytes transferred (possibly short) or -errno. The
// backend never throws out of submit() (an error becomes done(-errno)).
// The caller keeps the buffers alive until done runs, and destroys the
// backend only when no request is in flight.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "tier/workers.h"

namespace kvcache::tier {

struct IoRequest {
  int fd = -1;
  std::uint64_t offset = 0;
  bool write = false;
  std::array<iovec, 2> iov{};
  int iovcnt = 0;
  std::size_t bytes() const {
    std::size_t n = 0;
    for (int i = 0; i < iovcnt; ++i) n += iov[static_cast<std::size_t>(i)].iov_len;
    return n;
  }
};

using IoDone = std::function<void(long result)>;

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual std::string_view name() const = 0;  // "io_uring" | "threads"
  virtual void submit(const IoRequest& request, IoDone done) = 0;
};

// Blocking preadv / pwritev in a worker job (retrying EINTR and short
// transfers until end of file).
std::unique_ptr<IoBackend> make_thread_io(TierWorkers& workers);
// An io_uring of `depth` entries; null when the kernel refuses a ring
// (old kernel, seccomp), with the reason in *why.
std::unique_ptr<IoBackend> make_uring_io(TierWorkers& workers, unsigned depth, std::string* why);

}  // namespace kvcache::tier
