// HF Llama checkpoint loading: round trip through files the test writes, and
// malformed files refused with an InvalidArgument naming the problem.

#include "kvcache/engine/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kvcache/engine/model.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvcache_st_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  // A file with the given JSON header and `data_bytes` zero bytes of data.
  void write_with_header(const std::string& name, const std::string& header,
                         std::size_t data_bytes) const {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    write_raw(name, s + header + std::string(data_bytes, '\0'));
  }
  void expect_refused(const std::string& file, const std::string& needle) const {
    try {
      read_safetensors(path(file));
      FAIL() << "accepted " << file;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  fs::path dir_;
};

TEST_F(Safetensors, SavedModelLoadsBackIdentically) {
  const Model m = Model::from_seed(model_preset("tiny"), 77);
  save_model(m, dir_.string());
  const Model back = load_model(dir_.string());
  EXPECT_EQ(back.config().hidden_size, m.config().hidden_size);
  EXPECT_EQ(back.weights().layers[1].down_proj, m.weights().layers[1].down_proj);
  EXPECT_EQ(back.weights().lm_head, m.weights().lm_head);
  const std::vector<TokenId> t = {1, 5, 9, 3};
  EXPECT_EQ(back.forward_no_cache(t), m.forward_no_cache(t));
}

TEST_F(Safetensors, ReadsF16AndBf16) {
  // Two tensors: [2] f16 {1.0, -2.0} and [1] bf16 {0.5}.
  const std::string h =
      R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},"__metadata__":{"format":"pt"}})";
  std::string s(8, '\0');
  s[0] = static_cast<char>(h.size());
  s += h;
  s += std::string("\x00\x3c\x00\xc0\x00\x3f", 6);
  write_raw("x.safetensors", s);
  const TensorMap m = read_safetensors(path("x.safetensors"));
  EXPECT_EQ(m.at("a").data, (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(m.at("b").data, (std::vector<float>{0.5f}));
}

TEST_F(Safetensors, RefusesMalformedFiles) {
  write_raw("short", "abc");
  expect_refused("short", "< 8");
  write_with_header("hdr_past_end", "{}", 0);
  {  // claim a header far longer than the file
    std::string s(8, '\0');
    s[0] = 100;
    write_raw("hdr_past_end", s + "{}");
  }
  expect_refused("hdr_past_end", "header length 100");
  write_with_header("bad_json", "{not json", 0);
  expect_refused("bad_json", "not valid JSON");
  write_with_header("bad_dtype", R"({"w":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1);
  expect_refused("bad_dtype", "unsupported dtype 'I8'");
  write_with_header("past_data", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  expect_refused("past_data", "outside the 8 data bytes");
  write_with_header("wrong_size", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  expect_refused("wrong_size", "need 12");
  write_with_header("overlap",
                    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    12);
  expect_refused("overlap", "overlap");
  write_with_header("no_offsets", R"({"w":{"dtype":"F32","shape":[1]}})", 4);
  expect_refused("no_offsets", "'w'");
  EXPECT_THROW(read_safetensors(path("does_not_exist")), InvalidArgument);
}

TEST_F(Safetensors, RefusesCheckpointsThatDisagreeWithConfig) {
  const Model m = Model::from_seed(model_preset("tiny"), 1);
  save_model(m, dir_.string());
  // Drop a tensor.
  TensorMap t = read_safetensors(path("model.safetensors"));
  TensorMap missing = t;
  missing.erase("model.layers.1.mlp.up_proj.weight");
  write_safetensors(path("model.safetensors"), missing);
  try {
    load_model(dir_.string());
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("missing tensor 'model.layers.1.mlp.up_proj.weight'"),
              std::string::npos)
        << e.what();
  }
  // Wrong shape.
  TensorMap bad = t;
  bad["model.norm.weight"].shape = {16, 2};
  write_safetensors(path("model.safetensors"), bad);
  EXPECT_THROW(load_model(dir_.string()), InvalidArgument);
  // Broken config.json.
  write_safetensors(path("model.safetensors"), t);
  write_raw("config.json", R"({"vocab_size": 97})");
  EXPECT_THROW(load_model(dir_.string()), InvalidArgument);
  write_raw("config.json",
            R"({"vocab_size":97,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":2,)"
            R"("num_attention_heads":3,"num_key_value_heads":2})");
  EXPECT_THROW(load_model(dir_.string()), InvalidArgument);
}

}  // namespace
}  // namespace kvcache::engine
