// kvcache_log_child: the fresh process the LogEnv tests (log_test.cpp) start
// with KVCACHE_LOG_LEVEL set or unset. It makes a manager (which logs its
// geometry at info), then logs one line at trace, debug, info and error, so
// the parent can read from its stderr what the environment turned on.
#include <string>

#include "kvcache/log.h"
#include "kvcache/paged_manager.h"
#include "test_util.h"

int main() {
  using kvcache::LogLevel;
  kvcache::PagedKVCacheManager m(kvtest::paged_params(1, 1, 4, 4), 2, 2, 64);
  for (LogLevel l : {LogLevel::trace, LogLevel::debug, LogLevel::info, LogLevel::error}) {
    kvcache::log(l, "child " + std::string(kvcache::log_level_name(l)));
  }
  return 0;
}
