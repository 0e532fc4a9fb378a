// The parser fuzz driver in the regular suite: the corpus, then every
// single-byte corruption and truncation of the valid seed files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "reliability/parser_inputs.h"

namespace kvcache {
namespace {

std::vector<std::vector<std::uint8_t>> corpus() {
  const auto dir = std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "fuzz" / "corpus" / "parsers";
  std::vector<std::vector<std::uint8_t>> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return files;
}

TEST(ParserInputs, CorpusIsRefusedOrParsedCleanly) {
  const auto files = corpus();
  ASSERT_GE(files.size(), 2u);
  for (const auto& f : files) EXPECT_NO_THROW(testing::run_parser_input(f));
}

TEST(ParserInputs, CorruptionsAndTruncationsOfSeeds) {
  std::mt19937 rng(11);
  int inputs = 0;
  for (const auto& seed : corpus()) {
    for (std::size_t cut = 1; cut < seed.size(); cut += 1 + seed.size() / 64) {
      const std::vector<std::uint8_t> truncated(seed.begin(), seed.begin() + static_cast<std::ptrdiff_t>(cut));
      ASSERT_NO_THROW(testing::run_parser_input(truncated)) << "truncated at " << cut;
      ++inputs;
    }
    for (int i = 0; i < 200; ++i) {
      std::vector<std::uint8_t> bad = seed;
      bad[1 + rng() % (bad.size() - 1)] = static_cast<std::uint8_t>(rng());
      ASSERT_NO_THROW(testing::run_parser_input(bad)) << "corruption " << i;
      ++inputs;
    }
  }
  EXPECT_GT(inputs, 400);
}

}  // namespace
}  // namespace kvcache
