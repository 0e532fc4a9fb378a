#include "kvcache/log.h"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "kvcache/error.h"

namespace kvcache {

namespace {

constexpr std::string_view kLevelNames[] = {"trace", "debug", "info", "warn", "error", "off"};

bool valid(LogLevel level) { return static_cast<unsigned>(level) <= 5; }

void write_stderr(LogLevel level, std::string_view message) {
  std::string line = "kvcache [";
  line.append(log_level_name(level)).append("] ").append(message).push_back('\n');
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines do not interleave
}

// The process-wide logger: the level (atomic) and the sink (swapped under
// mu; null for the default stderr sink, so that first use allocates nothing).
class Logger {
 public:
  Logger() : level_(initial_level()) {}

  LogLevel level() const noexcept { return level_.load(std::memory_order_relaxed); }
  void set_level(LogLevel level) noexcept { level_.store(level, std::memory_order_relaxed); }

  void set_sink(LogSink sink) {
    auto next = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
    std::shared_ptr<const LogSink> old;
    {
      std::lock_guard lock(mu_);
      old = std::exchange(sink_, std::move(next));
    }
    // `old` is destroyed here, outside the lock (its captures may take locks of their own).
  }

  std::shared_ptr<const LogSink> sink() const {
    std::lock_guard lock(mu_);
    return sink_;
  }

 private:
  // KVCACHE_LOG_LEVEL, read once; off when unset, empty or not a level.
  static LogLevel initial_level() {
    const char* env = std::getenv("KVCACHE_LOG_LEVEL");
    if (env == nullptr || *env == '\0') return LogLevel::off;
    try {
      return parse_log_level(env);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvcache: KVCACHE_LOG_LEVEL: %s; logging stays off\n", e.what());
      return LogLevel::off;
    }
  }

  std::atomic<LogLevel> level_;
  mutable std::mutex mu_;
  std::shared_ptr<const LogSink> sink_;
};

Logger& logger() {
  // Never destroyed (threads may still log while static destructors run at
  // exit) and not on the heap (first use allocates nothing).
  alignas(Logger) static unsigned char storage[sizeof(Logger)];
  static Logger* const instance = new (storage) Logger;
  return *instance;
}

}  // namespace

std::string_view log_level_name(LogLevel level) noexcept {
  return valid(level) ? kLevelNames[static_cast<unsigned>(level)] : "unknown";
}

LogLevel parse_log_level(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "warning") return LogLevel::warn;
  for (unsigned i = 0; i < std::size(kLevelNames); ++i) {
    if (lower == kLevelNames[i]) return static_cast<LogLevel>(i);
  }
  throw InvalidArgument("log level '" + std::string(name) +
                        "' is not one of trace, debug, info, warn, error, off");
}

void set_log_level(LogLevel level) {
  if (!valid(level)) {
    throw InvalidArgument("log level " + std::to_string(static_cast<unsigned>(level)) +
                          " is not a LogLevel (0 trace ... 5 off)");
  }
  logger().set_level(level);
}

LogLevel log_level() noexcept { return logger().level(); }

bool log_enabled(LogLevel level) noexcept {
  return level != LogLevel::off && valid(level) && level >= logger().level();
}

void set_log_sink(LogSink sink) { logger().set_sink(std::move(sink)); }

void log(LogLevel level, std::string_view message) noexcept {
  if (!log_enabled(level)) return;
  try {
    const std::shared_ptr<const LogSink> sink = logger().sink();
    if (sink) {
      (*sink)(level, message);
    } else {
      write_stderr(level, message);
    }
  } catch (...) {  // a throwing sink (or no memory for the line) loses the line, nothing else
  }
}

}  // namespace kvcache
