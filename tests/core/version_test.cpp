// kvcache::version() and the KVCACHE_VERSION_* macros (kvcache/version.h).

#include "kvcache/version.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>

namespace kvcache {
namespace {

TEST(Version, LinkedLibraryMatchesTheHeaders) { EXPECT_STREQ(version(), KVCACHE_VERSION_STRING); }

TEST(Version, StringIsMajorMinorPatch) {
  const std::string expected = std::to_string(KVCACHE_VERSION_MAJOR) + "." +
                               std::to_string(KVCACHE_VERSION_MINOR) + "." +
                               std::to_string(KVCACHE_VERSION_PATCH);
  EXPECT_EQ(std::string(version()), expected);
  EXPECT_TRUE(std::regex_match(version(), std::regex(R"([0-9]+\.[0-9]+\.[0-9]+)"))) << version();
}

TEST(Version, MacrosWorkInPreprocessorConditions) {
#if KVCACHE_VERSION_MAJOR > 0 || KVCACHE_VERSION_MINOR >= 1
  SUCCEED();
#else
  FAIL() << "kvcache " << version() << " predates 0.1";
#endif
}

}  // namespace
}  // namespace kvcache
