// Runs the fuzz driver in the regular suite: every corpus file, then random
// programs from fixed seeds. A broken property throws std::logic_error.
#include "reliability/manager_ops.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

namespace kvcache {
namespace {

std::filesystem::path corpus_dir() {
  return std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "fuzz" / "corpus" /
         "manager";
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

// Programs whose every byte, read as an op by the tiered driver (byte % 14),
// leans to requests on the shared prompts (match_prefix), computing them,
// releasing them and the tier's calls: pages go down and come back often.
std::vector<std::uint8_t> tier_heavy_program(std::mt19937& rng) {
  static constexpr std::uint8_t kOps[] = {8, 8, 8, 8,  1,  1,  2,  3, 4,
                                          4, 4, 4, 11, 11, 12, 13, 9, 10};
  std::vector<std::uint8_t> bytes(64 + rng() % 512);
  for (auto& b : bytes)
    b = static_cast<std::uint8_t>(kOps[rng() % std::size(kOps)] + 14 * (rng() % 18));
  return bytes;
}

// More of the tier-heavy programs: a few hundred pages loaded back, with
// faults, all checked against the model.
TEST(ManagerOps, RandomTierHeavyPrograms) {
  std::mt19937 rng(20261127);
  testing::ManagerOpsFigures sum;
  for (int program = 0; program < 1000; ++program) {
    const std::vector<std::uint8_t> bytes = tier_heavy_program(rng);
    testing::ManagerOpsFigures f;
    ASSERT_NO_THROW(f = testing::run_manager_ops(bytes)) << "program " << program;
    sum.pages_loaded += f.pages_loaded;
    sum.load_faults += f.load_faults;
  }
  EXPECT_GT(sum.pages_loaded, 100u);
  EXPECT_GT(sum.load_faults, 10u);
  std::printf("tier-heavy runs: %llu pages loaded, %llu load faults\n",
              static_cast<unsigned long long>(sum.pages_loaded),
              static_cast<unsigned long long>(sum.load_faults));
}

TEST(ManagerOps, RandomPrograms) {
  std::mt19937 rng(20261121);
  testing::ManagerOpsFigures sum;
  for (int program = 0; program < 300; ++program) {
    std::vector<std::uint8_t> bytes(64 + rng() % 512);
    for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
    if (program % 2 == 1) bytes = tier_heavy_program(rng);
    testing::ManagerOpsFigures f;
    ASSERT_NO_THROW(f = testing::run_manager_ops(bytes)) << "program " << program;
    sum.pages_stored += f.pages_stored;
    sum.pages_loaded += f.pages_loaded;
    sum.tier_evictions += f.tier_evictions;
    sum.load_faults += f.load_faults;
  }
  // The tiered runs wrote back, loaded, evicted and failed loads.
  EXPECT_GT(sum.pages_stored, 0u);
  EXPECT_GT(sum.pages_loaded, 0u);
  EXPECT_GT(sum.tier_evictions, 0u);
  EXPECT_GT(sum.load_faults, 0u);
  std::printf(
      "tiered runs: %llu pages stored, %llu loaded, %llu tier evictions, %llu load faults\n",
      static_cast<unsigned long long>(sum.pages_stored),
      static_cast<unsigned long long>(sum.pages_loaded),
      static_cast<unsigned long long>(sum.tier_evictions),
      static_cast<unsigned long long>(sum.load_faults));
}

}  // namespace
}  // namespace kvcache
