// Runs the fuzz driver in the regular suite: every corpus file, then random
// programs from fixed seeds. A broken property throws std::logic_error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "reliability/manager_ops.h"

namespace kvcache {
namespace {

std::filesystem::path corpus_dir() {
  return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "fuzz" / "corpus" / "manager";
}

TEST(ManagerOps, CorpusReplays) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir())) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<std::uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
    EXPECT_NO_THROW(testing::run_manager_ops(bytes)) << entry.path();
    ++files;
  }
  EXPECT_GE(files, 3) << "the corpus in " << corpus_dir() << " is missing";
}

TEST(ManagerOps, RandomPrograms) {
  std::mt19937 rng(20261121);
  for (int program = 0; program < 300; ++program) {
    std::vector<std::uint8_t> bytes(64 + rng() % 512);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    ASSERT_NO_THROW(testing::run_manager_ops(bytes)) << "program " << program;
  }
}

}  // namespace
}  // namespace kvcache
