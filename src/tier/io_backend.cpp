#include "tier/io_backend.h"

#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace kvcache::tier {

namespace {

long transfer(const IoRequest& r) {
  std::array<iovec, 2> iov = r.iov;
  int first = 0;
  std::uint64_t offset = r.offset;
  long total = 0;
  while (first < r.iovcnt) {
    const ssize_t n =
        r.write ? pwritev(r.fd, iov.data() + first, r.iovcnt - first, static_cast<off_t>(offset))
                : preadv(r.fd, iov.data() + first, r.iovcnt - first, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;  // end of file: short
    total += n;
    offset += static_cast<std::uint64_t>(n);
    auto left = static_cast<std::size_t>(n);
    while (first < r.iovcnt && left >= iov[static_cast<std::size_t>(first)].iov_len) {
      left -= iov[static_cast<std::size_t>(first)].iov_len;
      ++first;
    }
    if (first < r.iovcnt) {
      iovec& v = iov[static_cast<std::size_t>(first)];
      v.iov_base = static_cast<char*>(v.iov_base) + left;
      v.iov_len -= left;
    }
  }
  return total;
}

class ThreadIo final : public IoBackend {
 public:
  explicit ThreadIo(TierWorkers& workers) : workers_(workers) {}
  std::string_view name() const override { return "threads"; }
  void submit(const IoRequest& request, IoDone done) override {
    workers_.post([request, done = std::move(done)] { done(transfer(request)); });
  }

 private:
  TierWorkers& workers_;
};

// One ring: submit() fills an SQE under sq_mu_ (waiting while `depth`
// requests are in flight); the reaper thread waits for CQEs and posts each
// completion to the workers. The pending map (under sq_mu_) carries each
// request's callback from the submitter to the reaper.
class UringIo final : public IoBackend {
 public:
  UringIo(TierWorkers& workers, unsigned depth) : workers_(workers), depth_(depth) {}
  bool start(std::string* why) {
    const int e = io_uring_queue_init(depth_, &ring_, 0);
    if (e < 0) {
      *why = std::string("io_uring_queue_init: ") + std::strerror(-e);
      return false;
    }
    ready_ = true;
    reaper_ = std::thread([this] { reap(); });
    return true;
  }
  ~UringIo() override {
    if (!ready_) return;
    {
      std::unique_lock lock(sq_mu_);
      room_.wait(lock, [&] { return in_flight_ < depth_; });
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, kStop);
      ++in_flight_;
      io_uring_submit(&ring_);
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }
  std::string_view name() const override { return "io_uring"; }

  void submit(const IoRequest& request, IoDone done) override {
    std::unique_lock lock(sq_mu_);
    room_.wait(lock, [&] { return in_flight_ < depth_; });
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    const std::uint64_t id = next_id_++;
    Pending& p = pending_[id];
    p.request = request;
    p.done = std::move(done);
    if (request.write) {
      io_uring_prep_writev(sqe, request.fd, p.request.iov.data(),
                           static_cast<unsigned>(request.iovcnt), request.offset);
    } else {
      io_uring_prep_readv(sqe, request.fd, p.request.iov.data(),
                          static_cast<unsigned>(request.iovcnt), request.offset);
    }
    io_uring_sqe_set_data64(sqe, id);
    ++in_flight_;
    const int e = io_uring_submit(&ring_);
    if (e < 0) {  // nothing queued: fail this request now
      IoDone d = std::move(p.done);
      pending_.erase(id);
      --in_flight_;
      lock.unlock();
      workers_.post([d = std::move(d), e] { d(e); });
    }
  }

 private:
  static constexpr std::uint64_t kStop = ~std::uint64_t{0};
  struct Pending {
    IoRequest request;  // its iovecs live here until the kernel is done with them
    IoDone done;
  };

  void reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int e = io_uring_wait_cqe(&ring_, &cqe);
      if (e == -EINTR) continue;
      if (e < 0) return;  // the ring is broken; nothing more will complete
      const std::uint64_t id = io_uring_cqe_get_data64(cqe);
      const long res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      IoDone done;
      {
        std::lock_guard lock(sq_mu_);
        --in_flight_;
        if (id != kStop) {
          auto it = pending_.find(id);
          done = std::move(it->second.done);
          pending_.erase(it);
        }
      }
      room_.notify_one();
      if (id == kStop) return;
      workers_.post([done = std::move(done), res] { done(res); });
    }
  }

  TierWorkers& workers_;
  const unsigned depth_;
  io_uring ring_{};
  bool ready_ = false;
  std::mutex sq_mu_;
  std::condition_variable room_;
  unsigned in_flight_ = 0;
  std::uint64_t next_id_ = 0;
  std::unordered_map<std::uint64_t, Pending> pending_;
  std::thread reaper_;
};

}  // namespace

std::unique_ptr<IoBackend> make_thread_io(TierWorkers& workers) {
  return std::make_unique<ThreadIo>(workers);
}

std::unique_ptr<IoBackend> make_uring_io(TierWorkers& workers, unsigned depth, std::string* why) {
  auto io = std::make_unique<UringIo>(workers, depth);
  if (!io->start(why)) return nullptr;
  return io;
}

}  // namespace kvcache::tier
