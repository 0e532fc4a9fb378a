// kvcache/log.h: levels and sinks, what the managers log, KVCACHE_LOG_LEVEL
// read by a child process (this test binary run again with one test
// selected and the variable set), and threads logging while the sink and the
// level change (TSan runs LogConcurrency).
#include "kvcache/log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvcache/kvcache.h"
#include "test_util.h"

extern char** environ;

namespace {

using kvcache::LogLevel;

// Captures every message; restores the default sink and level `off` after the test.
class LogCapture {
 public:
  LogCapture() {
    kvcache::set_log_sink([this](LogLevel level, std::string_view message) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(level, std::string(message));
    });
  }
  ~LogCapture() {
    kvcache::set_log_sink({});
    kvcache::set_log_level(LogLevel::off);
  }
  std::vector<std::pair<LogLevel, std::string>> lines() const {
    std::lock_guard lock(mu_);
    return lines_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<LogLevel, std::string>> lines_;
};

TEST(Log, SinkReceivesTheLevelAndAboveOnly) {
  LogCapture capture;
  kvcache::set_log_level(LogLevel::info);
  for (LogLevel l : {LogLevel::trace, LogLevel::debug, LogLevel::info, LogLevel::warn,
                     LogLevel::error, LogLevel::off}) {
    kvcache::log(l, kvcache::log_level_name(l));
  }
  const std::vector<std::pair<LogLevel, std::string>> want = {
      {LogLevel::info, "info"}, {LogLevel::warn, "warn"}, {LogLevel::error, "error"}};
  EXPECT_EQ(capture.lines(), want);
  EXPECT_TRUE(kvcache::log_enabled(LogLevel::warn));
  EXPECT_FALSE(kvcache::log_enabled(LogLevel::debug));
  EXPECT_FALSE(kvcache::log_enabled(LogLevel::off));
}

TEST(Log, OffDeliversNothingAndFormatsNothing) {
  LogCapture capture;
  kvcache::set_log_level(LogLevel::off);
  int formatted = 0;
  for (LogLevel l : {LogLevel::trace, LogLevel::error, LogLevel::off}) {
    kvcache::log_with(l, [&] {
      ++formatted;
      return std::string("never");
    });
  }
  EXPECT_EQ(formatted, 0);
  EXPECT_TRUE(capture.lines().empty());
  kvcache::set_log_level(LogLevel::trace);
  kvcache::log_with(LogLevel::trace, [&] {
    ++formatted;
    return std::string("now");
  });
  EXPECT_EQ(formatted, 1);
  EXPECT_EQ(capture.lines().size(), 1u);
}

TEST(Log, ParsesLevelNames) {
  EXPECT_EQ(kvcache::parse_log_level("trace"), LogLevel::trace);
  EXPECT_EQ(kvcache::parse_log_level("DEBUG"), LogLevel::debug);
  EXPECT_EQ(kvcache::parse_log_level("Info"), LogLevel::info);
  EXPECT_EQ(kvcache::parse_log_level("warning"), LogLevel::warn);
  EXPECT_EQ(kvcache::parse_log_level("error"), LogLevel::error);
  EXPECT_EQ(kvcache::parse_log_level("off"), LogLevel::off);
  KV_EXPECT_THROW(kvcache::parse_log_level("loud"), kvcache::InvalidArgument, "'loud'",
                  "trace, debug, info, warn, error, off");
  KV_EXPECT_THROW(kvcache::parse_log_level(""), kvcache::InvalidArgument, "''");
  KV_EXPECT_THROW(kvcache::set_log_level(static_cast<LogLevel>(6)), kvcache::InvalidArgument,
                  "log level 6");
  EXPECT_EQ(kvcache::log_level_name(static_cast<LogLevel>(9)), "unknown");
}

TEST(Log, ThrowingSinkLosesTheLineOnly) {
  LogCapture restore;
  kvcache::set_log_level(LogLevel::debug);
  kvcache::set_log_sink([](LogLevel, std::string_view) { throw std::runtime_error("sink"); });
  EXPECT_NO_THROW(kvcache::log(LogLevel::error, "dropped"));
}

TEST(Log, ManagersLogConstructionAndEvictions) {
  LogCapture capture;
  kvcache::set_log_level(LogLevel::debug);
  auto p = kvtest::paged_params(1, 1, 4, 4);
  p.enable_prefix_caching = true;
  kvcache::PagedKVCacheManager m(p, 2, 2, 64);
  kvcache::ContinuousBatchingKVCacheManager c(kvtest::continuous_params(1, 1, 4), 2, 8);
  const kvtest::Ids a = m.claim(1);
  m.fetch(a, kvtest::U32{8});
  m.step(a, kvtest::U32{8}, kvtest::U32{1, 2, 3, 4, 5, 6, 7, 8});
  m.release(a[0]);  // 2 pages cached
  const kvtest::Ids b = m.claim(1);
  m.fetch(b, kvtest::U32{5});  // other content: both evicted
  const auto lines = capture.lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].first, LogLevel::info);
  EXPECT_EQ(lines[0].second.rfind("paged manager: 2 pages of 4 tokens (1 layers, 1 KV heads x 4, "
                                  "f32, nhd, interleaved, 1 device): 256 bytes, ",
                                  0),
            0u)
      << lines[0].second;
  EXPECT_TRUE(lines[0].second.ends_with(" bytes of bookkeeping, prefix caching adaptive"))
      << lines[0].second;
  EXPECT_EQ(lines[1].first, LogLevel::info);
  EXPECT_EQ(lines[1].second.rfind("continuous manager: 2 slots of 8 tokens", 0), 0u)
      << lines[1].second;
  EXPECT_EQ(lines[2].first, LogLevel::debug);
  EXPECT_EQ(lines[2].second,
            "paged manager: fetch (batch of 1) evicted 2 cached pages, made 0 copy-on-write "
            "copies; 0 free, 0 cached");
}

// ---- KVCACHE_LOG_LEVEL, read by a fresh process --------------------------------

// Runs kvcache_log_child (log_child_main.cpp) with KVCACHE_LOG_LEVEL set to
// `level` (unset when nullptr); returns its stderr.
std::string child_stderr(const char* level) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "KVCACHE_LOG_LEVEL=", 18) != 0) env.emplace_back(*e);
  }
  if (level != nullptr) env.push_back(std::string("KVCACHE_LOG_LEVEL=") + level);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = KVCACHE_LOG_CHILD;
  char* argv[] = {exe.data(), nullptr};
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, std::size_t(n));
  close(fds[0]);
  if (rc != 0) return "posix_spawn failed";
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  return out;
}

TEST(LogEnv, DebugFromTheEnvironment) {
  const std::string err = child_stderr("debug");
  EXPECT_NE(err.find("kvcache [info] paged manager: 2 pages of 4 tokens"), std::string::npos)
      << err;
  EXPECT_NE(err.find("kvcache [debug] child debug\n"), std::string::npos) << err;
  EXPECT_NE(err.find("kvcache [error] child error\n"), std::string::npos) << err;
  EXPECT_EQ(err.find("child trace"), std::string::npos) << err;
}

TEST(LogEnv, SilentByDefault) {
  EXPECT_EQ(child_stderr(nullptr).find("kvcache"), std::string::npos);
  EXPECT_EQ(child_stderr("off").find("kvcache"), std::string::npos);
}

TEST(LogEnv, UpperCaseAndWarning) {
  const std::string err = child_stderr("WARNING");
  EXPECT_NE(err.find("kvcache [error] child error\n"), std::string::npos) << err;
  EXPECT_EQ(err.find("child info"), std::string::npos) << err;
}

TEST(LogEnv, NotALevelSaysSoAndStaysOff) {
  const std::string err = child_stderr("loud");
  EXPECT_NE(err.find("KVCACHE_LOG_LEVEL: log level 'loud' is not one of trace, debug, info, "
                     "warn, error, off; logging stays off"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("child"), std::string::npos) << err;
}

// ---- threads -------------------------------------------------------------------

TEST(LogConcurrency, ThreadsLogWhileSinkAndLevelChange) {
  LogCapture restore;
  std::atomic<long> first{0}, second{0};
  const kvcache::LogSink count_first = [&](LogLevel, std::string_view) { ++first; };
  const kvcache::LogSink count_second = [&](LogLevel, std::string_view) { ++second; };
  constexpr int kThreads = 4, kMessages = 2000;
  auto log_many = [] {
    for (int i = 0; i < kMessages; ++i) {
      kvcache::log_with(LogLevel::info, [i] { return "message " + std::to_string(i); });
    }
  };
  // Phase 1: the sink and the level change under the loggers' feet.
  std::atomic<bool> done{false};
  std::thread changer([&] {
    for (int i = 0; !done.load(); ++i) {
      kvcache::set_log_sink(i % 2 ? count_first : count_second);
      kvcache::set_log_level(i % 3 ? LogLevel::info : LogLevel::off);
    }
  });
  std::vector<std::thread> loggers;
  for (int t = 0; t < kThreads; ++t) loggers.emplace_back(log_many);
  for (auto& l : loggers) l.join();
  done = true;
  changer.join();
  EXPECT_LE(first + second, long{kThreads} * kMessages);
  // Phase 2: one sink, one level: every message arrives once.
  kvcache::set_log_sink(count_first);
  kvcache::set_log_level(LogLevel::info);
  first = 0;
  loggers.clear();
  for (int t = 0; t < kThreads; ++t) loggers.emplace_back(log_many);
  for (auto& l : loggers) l.join();
  EXPECT_EQ(first.load(), long{kThreads} * kMessages);
}

}  // namespace
