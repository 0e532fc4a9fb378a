// Hostile model files (issue 40, items 3 and 10): nesting that overflowed the
// stack, values echoed whole into messages, a NUL that cut a message short,
// refusals that did not name the file, and paths that are not files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/json_input.h"
#include "kvcache/engine/safetensors.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

namespace fs = std::filesystem;

class HostileFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvcache_hostile_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // A safetensors file with this JSON header and `data` bytes of zeros.
  std::string safetensors(const std::string& name, const std::string& header,
                          std::size_t data = 0) const {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return write(name, s + header + std::string(data, '\0'));
  }
  // The message of the InvalidArgument f throws (fails the test otherwise).
  template <class F>
  static std::string refusal(F&& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    ADD_FAILURE() << "not refused with InvalidArgument";
    return {};
  }

  fs::path dir_;
};

std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// A 200 KB config.json nested 100,000 levels crashed `kvcache generate
// --model DIR` (json::dump recursing per level in the error path).
TEST_F(HostileFiles, DeeplyNestedConfigIsRefusedWithoutRecursion) {
  const std::string p = write("config.json", "{\"vocab_size\": " + nested(100000) + "}");
  const std::string m = refusal([&] { read_hf_config(p); });
  EXPECT_NE(m.find("more than 64 levels deep"), std::string::npos) << m;
  EXPECT_NE(m.find("config.json"), std::string::npos) << m;
}

TEST_F(HostileFiles, DeeplyNestedSafetensorsHeaderIsRefused) {
  const std::string p = safetensors("deep.safetensors", "{\"w\": " + nested(100000) + "}");
  const std::string m = refusal([&] { read_safetensors(p); });
  EXPECT_NE(m.find("more than 64 levels deep"), std::string::npos) << m;
  EXPECT_NE(m.find("deep.safetensors"), std::string::npos) << m;
}

TEST_F(HostileFiles, NestingUpToTheLimitParses) {
  EXPECT_NO_THROW(json_input::parse(nested(json_input::kMaxJsonDepth)));
  EXPECT_THROW(json_input::parse(nested(json_input::kMaxJsonDepth + 1)), InvalidArgument);
}

// A 3-million-element array was echoed whole into a 6 MB message.
TEST_F(HostileFiles, HugeValuesAreDescribedNotEchoed) {
  std::string array = "[0";
  for (int i = 1; i < 3'000'000; ++i) array += ",0";
  array += "]";
  const std::string p = write("config.json", "{\"vocab_size\": " + array + "}");
  const std::string m = refusal([&] { read_hf_config(p); });
  EXPECT_NE(m.find("vocab_size is an array of 3000000 elements"), std::string::npos) << m;
  EXPECT_LT(m.size(), 400u) << m.substr(0, 400);
  const std::string s = write("s.json", "{\"vocab_size\": \"" + std::string(1 << 20, 'x') + "\"}");
  const std::string ms = refusal([&] { read_hf_config(s); });
  EXPECT_LT(ms.size(), 400u) << ms.substr(0, 400);
  EXPECT_NE(ms.find("xxx...'"), std::string::npos) << ms;
}

// A NUL in a tensor name cut the C string of the message; now escaped.
TEST_F(HostileFiles, NulInATensorNameIsEscaped) {
  const std::string p = safetensors(
      "nul.safetensors", R"({"a\u0000b":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1);
  const std::string m = refusal([&] { read_safetensors(p); });
  EXPECT_EQ(m.find('\0'), std::string::npos);
  EXPECT_NE(std::string(m.c_str()).find("tensor 'a\\u0000b' has unsupported dtype 'I8'"),
            std::string::npos)
      << m;
}

// Every safetensors refusal names the file, those from number checks included.
TEST_F(HostileFiles, SafetensorsRefusalsNameTheFile) {
  const std::string headers[] = {
      R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
      R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})",
      R"({"w":{"dtype":"F32","shape":"x","data_offsets":[0,4]}})",
      R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})",
      R"({"w":{"shape":[1],"data_offsets":[0,4]}})",
      R"({"w":[1,2]})",
      R"([1,2])",
      R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})",
  };
  int i = 0;
  for (const std::string& h : headers) {
    const std::string name = "bad" + std::to_string(i++) + ".safetensors";
    const std::string m = refusal([&] { read_safetensors(safetensors(name, h, 4)); });
    EXPECT_NE(m.find(name), std::string::npos) << h << " -> " << m;
  }
}

TEST_F(HostileFiles, PathsThatAreNotRegularFilesAreRefused) {
  for (const std::string& p : {dir_.string(), std::string("/dev/zero")}) {
    EXPECT_NE(refusal([&] { read_safetensors(p); }).find("not a regular file"), std::string::npos);
    EXPECT_NE(refusal([&] { read_hf_config(p); }).find("not a regular file"), std::string::npos);
  }
  const std::string missing = (dir_ / "missing.json").string();
  EXPECT_NE(refusal([&] { read_hf_config(missing); }).find("missing.json"), std::string::npos);
}

TEST_F(HostileFiles, SafetensorsHeaderPastTheFormatLimitIsRefused) {
  std::string s(8, '\0');
  const std::uint64_t n = 100'000'001;
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  const std::string p = write("big.safetensors", s + "{}");
  EXPECT_NE(refusal([&] { read_safetensors(p); }).find("limit of 100000000"), std::string::npos);
}

}  // namespace
}  // namespace kvcache::engine
