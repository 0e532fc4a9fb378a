// tools/progress.h — a one-line progress bar with an ETA for long commands
// (`demo`, `replay`), on stderr only when stderr is a terminal.
//
// Each update builds the line ("  label  [####......] 12/64  ETA 0:07") and
// writes it only when it differs from the line last drawn, so a command that
// reports progress every step redraws a few times a second at most, not per
// step. The ETA is the elapsed time per item times the items left; the line
// is erased when done == total. Not thread-safe (one per loop).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <iostream>
#include <ostream>
#include <string>

namespace kvcache::tools {

class Progress {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic

  static double steady_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // Where a bar goes: stderr when it is a terminal, else nowhere (nullptr).
  static std::ostream* terminal() { return isatty(STDERR_FILENO) != 0 ? &std::cerr : nullptr; }

  // out == nullptr: the bar is not drawn (updates cost a comparison).
  Progress(std::string label, std::ostream* out, Clock clock = steady_seconds)
      : label_(std::move(label)), out_(out), clock_(std::move(clock)), start_(clock_()) {}

  void operator()(std::size_t done, std::size_t total) {
    if (out_ == nullptr || total == 0) return;
    const std::string line = render(done, total, clock_() - start_);
    if (line == last_) return;
    last_ = line;
    ++redraws_;
    *out_ << '\r' << line;
    if (done >= total) *out_ << '\r' << std::string(line.size(), ' ') << '\r';
    out_->flush();
  }

  // Lines written so far.
  std::size_t redraws() const { return redraws_; }

  // The line for `done` of `total` items after `elapsed` seconds.
  std::string render(std::size_t done, std::size_t total, double elapsed) const {
    constexpr std::size_t kWidth = 30;
    const std::size_t filled = (done < total ? done : total) * kWidth / total;
    std::string eta = "--:--";
    if (done > 0 && done < total) {
      eta = clock_text(elapsed / static_cast<double>(done) * static_cast<double>(total - done));
    } else if (done >= total) {
      eta = "0:00";
    }
    char counts[64];
    std::snprintf(counts, sizeof counts, "] %zu/%zu  ETA ", done, total);
    std::string line = "  " + label_;
    if (line.size() < 26) line.resize(26, ' ');
    return line + " [" + std::string(filled, '#') + std::string(kWidth - filled, '.') + counts +
           eta;
  }

  // 7.4 -> "0:07", 3725 -> "1:02:05".
  static std::string clock_text(double seconds) {
    const auto s = static_cast<long long>(seconds + 0.5);
    char buf[32];
    if (s >= 3600) {
      std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    } else {
      std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
    }
    return buf;
  }

 private:
  std::string label_;
  std::ostream* out_;
  Clock clock_;
  double start_;
  std::string last_;
  std::size_t redraws_ = 0;
};

}  // namespace kvcache::tools
