// The one rule for sizes typed by people (kvcache/engine/units.h): decimal
// K/M/G/T/P, binary Ki/Mi/Gi/Ti/Pi, "B" for bytes, exact arithmetic.
#include "kvcache/engine/units.h"

#include <gtest/gtest.h>

#include "kvcache/error.h"
#include "test_util.h"

namespace kvcache::engine {
namespace {

TEST(Units, DecimalAndBinarySuffixesForBytes) {
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_EQ(parse_byte_size("512B"), 512u);
  EXPECT_EQ(parse_byte_size("8G"), 8000000000u);
  EXPECT_EQ(parse_byte_size("8GB"), 8000000000u);
  EXPECT_EQ(parse_byte_size("8gb"), 8000000000u);
  EXPECT_EQ(parse_byte_size("8Gi"), 8589934592u);
  EXPECT_EQ(parse_byte_size("8GiB"), 8589934592u);
  EXPECT_EQ(parse_byte_size("16 GiB"), std::uint64_t{16} << 30);
  EXPECT_EQ(parse_byte_size("32MiB"), std::uint64_t{32} << 20);
  EXPECT_EQ(parse_byte_size("32M"), 32000000u);
  EXPECT_EQ(parse_byte_size("1.5GiB"), std::uint64_t{3} << 29);
  EXPECT_EQ(parse_byte_size("1.5KiB"), 1536u);
  EXPECT_EQ(parse_byte_size("2TB"), 2000000000000u);
  EXPECT_EQ(parse_byte_size("1PiB"), std::uint64_t{1} << 50);
  EXPECT_EQ(parse_byte_size("4096PiB"), kMaxByteSize);
}

TEST(Units, RefusesBytesNamingTextReasonAndLimit) {
  KV_EXPECT_THROW(parse_byte_size("12parsecs"), InvalidArgument, "'12parsecs'", "unknown suffix",
                  "2^10");
  KV_EXPECT_THROW(parse_byte_size("1.3KiB"), InvalidArgument, "'1.3KiB'", "whole number");
  KV_EXPECT_THROW(parse_byte_size("0"), InvalidArgument, "'0'", "at least 1 byte");
  KV_EXPECT_THROW(parse_byte_size("4097PiB"), InvalidArgument, "too large", "4611686018427387904");
  for (const char* bad : {"", "-1", "nan", "inf", "1e9", ".5K", "1.2.3", "8iB", "8KB B", "GiB",
                          "99999999999999999999999999999999999999999"}) {
    KV_EXPECT_THROW(parse_byte_size(bad), InvalidArgument, "memory");
  }
}

TEST(Units, CountsTakeTheSameSuffixesButNoB) {
  EXPECT_EQ(parse_token_count("250K"), 250000u);
  EXPECT_EQ(parse_token_count("3M"), 3000000u);
  EXPECT_EQ(parse_token_count("4Mi"), std::uint64_t{4} << 20);
  EXPECT_EQ(parse_token_count("1G"), 1000000000u);
  EXPECT_EQ(parse_token_count("1Ti"), kMaxTokenCount);
  KV_EXPECT_THROW(parse_token_count("1MB"), InvalidArgument, "token count '1MB'", "suffix");
  KV_EXPECT_THROW(parse_token_count("2T"), InvalidArgument, "too large", "1099511627776");
}

}  // namespace
}  // namespace kvcache::engine
