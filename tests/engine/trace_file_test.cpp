// Mooncake trace files and token counts read with every number checked
// (issue 40, items 7 and 8): each number the loaders once wrapped, truncated
// or converted undefined is refused naming the line, the field and the
// limit, and so are paths that are not traces. Property tests: any number
// written into a field is either read exactly or refused; any text given as
// a token count is either a whole count within the limit or refused.
#include "kvcache/engine/trace_file.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "kvcache/engine/workload.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

namespace fs = std::filesystem;

std::string line_with(const std::string& input, const std::string& output = "5",
                      const std::string& ids = "[0, 1000]", const std::string& ts = "0") {
  return "{\"timestamp\": " + ts + ", \"input_length\": " + input +
         ", \"output_length\": " + output + ", \"hash_ids\": " + ids + "}";
}

std::string refusal(const std::string& line) {
  try {
    parse_trace_line(line);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(TraceFile, ReadsAWellFormedLine) {
  const TraceRequest r = parse_trace_line(line_with("600", "5", "[0, 1000]", "12.5"));
  EXPECT_EQ(r.timestamp_ms, 12.5);
  EXPECT_EQ(r.input_length, 600u);
  EXPECT_EQ(r.output_length, 5u);
  EXPECT_EQ(r.hash_ids, (std::vector<std::uint64_t>{0, 1000}));
  EXPECT_EQ(parse_trace_line(line_with("1", "0", "[18446744073709551615]")).hash_ids[0],
            UINT64_MAX);
}

// Each value the old loader accepted wrongly: wrapped (4294967897 -> 601),
// truncated (600.7 -> 600), wrapped negative (-1 -> 2^32 - 1), undefined
// (1e20), and hash ids 1.5 and -2.
TEST(TraceFile, RefusesNumbersItOnceWrappedOrTruncated) {
  const std::pair<std::string, std::string> cases[] = {
      {line_with("4294967897"), "input_length is 4294967897"},
      {line_with("600.7"), "input_length is 600.7"},
      {line_with("-1"), "input_length is -1"},
      {line_with("1e20"), "input_length is 1e+20"},
      {line_with("600", "100000000"), "output_length is 100000000"},
      {line_with("600", "4294967295"), "output_length is 4294967295"},
      {line_with("600", "5", "[0, 1.5]"), "hash_ids[1] is 1.5"},
      {line_with("600", "5", "[-2, 1]"), "hash_ids[0] is -2"},
      {line_with("600", "5", "[0, \"7\"]"), "hash_ids[1] is the string '7'"},
      {line_with("600", "5", "[0, 1]", "-1"), "timestamp is -1"},
      {line_with("600", "5", "[0, 1]", "1e300"), "timestamp is 1e+300"},
      {line_with("600", "5", "[0, 1]", "\"x\""), "timestamp is the string 'x'"},
      {"{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}", "no hash_ids member"},
      {"[1, 2]", "not an object"},
      {"{\"timestamp\": ", "not valid JSON"},
  };
  for (const auto& [line, want] : cases) {
    const std::string m = refusal(line);
    EXPECT_NE(m.find(want), std::string::npos) << line << " -> " << m;
  }
  EXPECT_NE(refusal(line_with("1048577")).find("[0, 1048576]"), std::string::npos);
}

// 8M hash ids on one line asked for ~17 GB: refused before any is stored.
TEST(TraceFile, RefusesMoreHashIdsThanTheLimit) {
  std::string ids = "[0";
  for (std::size_t i = 1; i <= kMaxTraceHashIds; ++i) ids += "," + std::to_string(i);
  ids += "]";
  const std::string m = refusal(line_with("600", "5", ids));
  EXPECT_NE(m.find("an array of 2049 elements: expected an array of at most 2048"),
            std::string::npos)
      << m;
}

class TraceFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvcache_trace_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  static std::string read_refusal(const std::string& path) {
    try {
      read_mooncake_trace(path);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "accepted";
  }
  fs::path dir_;
};

TEST_F(TraceFiles, NamesTheFileAndTheLine) {
  const std::string p = write("t.jsonl", line_with("600") + "\n\n" + line_with("-1") + "\n");
  const std::string m = read_refusal(p);
  EXPECT_NE(m.find("t.jsonl':3: input_length is -1"), std::string::npos) << m;
  EXPECT_EQ(
      read_mooncake_trace(write("ok.jsonl", line_with("600") + "\n" + line_with("512", "0", "[7]")))
          .size(),
      2u);
}

// A directory and /dev/zero were read as empty traces (exit 0).
TEST_F(TraceFiles, RefusesWhatIsNotATrace) {
  EXPECT_NE(read_refusal(dir_.string()).find("reading failed"), std::string::npos)
      << read_refusal(dir_.string());
  EXPECT_NE(read_refusal("/dev/zero").find("longer than the limit of 1048576 bytes"),
            std::string::npos)
      << read_refusal("/dev/zero");
  EXPECT_NE(read_refusal(write("empty.jsonl", "\n  \n")).find("holds no requests"),
            std::string::npos);
  EXPECT_NE(read_refusal((dir_ / "missing").string()).find("cannot be opened"), std::string::npos);
}

// The demo's loader goes through the same reader, and its scale is bounded.
TEST_F(TraceFiles, DemoLoaderRefusesTheSameNumbersAndABadScale) {
  const std::string bad = write("bad.jsonl", line_with("4294967897") + "\n");
  EXPECT_THROW(load_mooncake_trace(bad, TraceOptions{}), InvalidArgument);
  const std::string ok = write("ok.jsonl", line_with("600") + "\n" + line_with("600") + "\n");
  for (double scale : {0.0, -1.0, 17.0, std::nan(""), HUGE_VAL}) {
    TraceOptions o;
    o.scale = scale;
    EXPECT_THROW(load_mooncake_trace(ok, o), InvalidArgument) << scale;
  }
  TraceOptions o;
  o.max_requests = 1;
  EXPECT_EQ(load_mooncake_trace(ok, o).size(), 1u);
}

// `demo --requests 4294967295` ended in bad_alloc: the chat workload is bounded.
TEST(Workload, ChatWorkloadRefusesMorePromptTokensThanTheLimit) {
  ChatWorkloadOptions o;
  o.requests = 4294967295u;
  try {
    chat_workload(o);
    FAIL() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("4294967295 requests"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("268435456"), std::string::npos) << e.what();
  }
  o.requests = 4;
  o.rate = HUGE_VAL;
  EXPECT_THROW(chat_workload(o), InvalidArgument);
}

TEST(TokenCount, ParsesCountsAndRefusesTheRest) {
  EXPECT_EQ(parse_token_count("unlimited"), 0u);
  EXPECT_EQ(parse_token_count("0"), 0u);
  EXPECT_EQ(parse_token_count("3000000"), 3000000u);
  EXPECT_EQ(parse_token_count("512K"), 512000u);
  EXPECT_EQ(parse_token_count("1.5M"), 1500000u);
  EXPECT_EQ(parse_token_count("1.000001M"), 1000001u);
  EXPECT_EQ(parse_token_count("1099511627776"), kMaxTokenCount);
  for (const char* bad : {"nan", "inf", "-1", "1e30M", "1.5", "12parsecs", "", ".5K", "1.2.3",
                          "1099511627777", "99999999999999999999999", "1.0000001M"}) {
    EXPECT_THROW(parse_token_count(bad), InvalidArgument) << bad;
  }
}

// Any integer written as a field is read exactly when in range, else refused.
RC_GTEST_PROP(TraceFileProperty, IntegerFieldsAreExactOrRefused, (std::int64_t input)) {
  const std::string line = line_with(std::to_string(input), "0", "[1, 2, 3]");
  try {
    const TraceRequest r = parse_trace_line(line);
    RC_ASSERT(input >= 0 && input <= std::int64_t{kMaxTraceRequestTokens});
    RC_ASSERT(r.input_length == static_cast<std::uint64_t>(input));
  } catch (const InvalidArgument&) {
    RC_ASSERT(input < 0 || input > std::int64_t{kMaxTraceRequestTokens});
  }
}

// Any double written as a length (fractions, exponents, huge values) is
// refused unless it is written as an integer in range; never converted.
RC_GTEST_PROP(TraceFileProperty, FloatingLengthsAreRefused, (double v)) {
  RC_PRE(std::isfinite(v));
  std::ostringstream text;
  text.precision(17);
  text << std::scientific << v;  // always has an exponent: a JSON float
  RC_ASSERT_THROWS_AS(parse_trace_line(line_with("600", text.str())), InvalidArgument);
}

// Any text: a count within the limit that reads back, or InvalidArgument.
RC_GTEST_PROP(TokenCountProperty, AnyTextIsACountOrRefused, (const std::string& text)) {
  try {
    const std::uint64_t n = parse_token_count(text);
    RC_ASSERT(n <= kMaxTokenCount);
  } catch (const InvalidArgument&) {
  }
}

RC_GTEST_PROP(TokenCountProperty, WholeCountsRoundTrip, (std::uint32_t n)) {
  RC_ASSERT(parse_token_count(std::to_string(n)) == n);
  if (std::uint64_t{n} * 1000 <= kMaxTokenCount) {
    RC_ASSERT(parse_token_count(std::to_string(n) + "K") == std::uint64_t{n} * 1000);
  } else {
    RC_ASSERT_THROWS_AS(parse_token_count(std::to_string(n) + "K"), InvalidArgument);
  }
  RC_ASSERT(parse_token_count(std::to_string(n / 1000) + "." +
                              std::to_string(1000 + n % 1000).substr(1) + "K") == n);
}

}  // namespace
}  // namespace kvcache::engine
