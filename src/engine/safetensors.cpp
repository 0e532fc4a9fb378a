// safetensors + config.json reader/writer for HF Llama checkpoints.

#include "kvcache/engine/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/json_input.h"
#include "kvcache/dtype.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

using json_input::excerpt;
using json_input::printable;
using nlohmann::json;

// The safetensors format's own limit on the header (100 MB), and ours on
// config.json (real ones are a few KiB).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::uint64_t kMaxConfigBytes = std::uint64_t{16} << 20;

template <class U>
U json_uint_or(const json& j, const char* field, U fallback) {
  return j.contains(field) ? json_input::to_uint<U>(j.at(field), field) : fallback;
}

float json_float_or(const json& j, const char* field, float fallback) {
  if (!j.contains(field)) return fallback;
  const double max = std::numeric_limits<float>::max();
  return static_cast<float>(json_input::to_double(j.at(field), field, -max, max));
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InvalidArgument("safetensors " + printable(path, json_input::kMaxPathEcho) + ": " + what);
}

// The deepest tensor accepted (Llama checkpoints use 1 and 2 dimensions).
constexpr std::size_t kMaxRank = 16;

std::size_t element_size(const std::string& path, const std::string& label,
                         const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  fail(path, label + " has unsupported dtype " + printable(dtype) + " (F32, F16, BF16)");
}

std::vector<float> convert(const char* p, std::size_t n, const std::string& dtype) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (dtype == "F32") {
      std::memcpy(&out[i], p + 4 * i, 4);
    } else {
      std::uint16_t bits;
      std::memcpy(&bits, p + 2 * i, 2);
      out[i] = dtype == "F16" ? to_float(Half{bits}) : to_float(BFloat16{bits});
    }
  }
  return out;
}

// The entry's dtype, shape and data offsets; refusals name the tensor.
struct TensorEntry {
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

// Runs f, naming the file in the InvalidArgument json_input throws.
template <class F>
auto in_file(const std::string& path, F&& f) {
  try {
    return f();
  } catch (const InvalidArgument& e) {
    fail(path, e.what());
  }
}

const json& member(const std::string& path, const std::string& label, const json& info,
                   const char* key) {
  const auto it = info.find(key);
  if (it == info.end()) fail(path, label + " has no " + key);
  return *it;
}

TensorEntry read_entry(const std::string& path, const std::string& label, const json& info) {
  if (!info.is_object()) fail(path, label + " is " + excerpt(info) + ", not an object");
  TensorEntry e;
  const json& dtype = member(path, label, info, "dtype");
  if (!dtype.is_string()) fail(path, label + " dtype is " + excerpt(dtype) + ", not a string");
  e.dtype = dtype.get<std::string>();
  e.shape = in_file(path, [&] {
    return json_input::to_uint_list(member(path, label, info, "shape"), label + " shape", kMaxRank,
                                    UINT64_MAX);
  });
  const auto offs = in_file(path, [&] {
    return json_input::to_uint_list(member(path, label, info, "data_offsets"),
                                    label + " data_offsets", 2, UINT64_MAX);
  });
  if (offs.size() != 2) fail(path, label + " data_offsets needs 2 values");
  e.begin = offs[0], e.end = offs[1];
  return e;
}

Tensor read_tensor(const std::string& path, const std::string& name, const json& info,
                   const char* data, std::uint64_t data_size,
                   std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges) {
  const std::string label = "tensor " + printable(name);
  const TensorEntry e = read_entry(path, label, info);
  const std::size_t esize = element_size(path, label, e.dtype);
  std::uint64_t count = 1;
  for (std::uint64_t d : e.shape) {
    if (d != 0 && count > (std::uint64_t{1} << 40) / d) fail(path, label + " too large");
    count *= d;
  }
  if (e.begin > e.end || e.end > data_size) {
    fail(path, label + " data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                   ") outside the " + std::to_string(data_size) + " data bytes");
  }
  if (e.end - e.begin != count * esize) {
    fail(path, label + " has " + std::to_string(e.end - e.begin) +
                   " bytes, its shape and dtype need " + std::to_string(count * esize));
  }
  ranges.emplace_back(e.begin, e.end);
  return Tensor{e.shape, convert(data + e.begin, count, e.dtype)};
}

void check_overlaps(const std::string& path,
                    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      fail(path, "tensors overlap at data offset " + std::to_string(ranges[i].first));
    }
  }
}

std::vector<float> take(const std::string& path, TensorMap& m, const std::string& name,
                        std::vector<std::uint64_t> shape) {
  auto it = m.find(name);
  if (it == m.end()) fail(path, "missing tensor " + printable(name));
  if (it->second.shape != shape) {
    std::string want, got;
    for (auto d : shape) want += std::to_string(d) + ",";
    for (auto d : it->second.shape) got += std::to_string(d) + ",";
    fail(path, "tensor " + printable(name) + " has shape [" + got + "], config.json needs [" +
                   want + "]");
  }
  return std::move(it->second.data);
}

}  // namespace

TensorMap read_safetensors(const std::string& path) {
  const std::string bytes =
      in_file(path, [&] { return json_input::read_regular_file(path, UINT64_MAX); });
  if (bytes.size() < 8) fail(path, "file has " + std::to_string(bytes.size()) + " bytes, < 8");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(n) + " exceeds the format's limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > bytes.size() - 8) {
    fail(path, "header length " + std::to_string(n) + " exceeds the " +
                   std::to_string(bytes.size() - 8) + " bytes after it");
  }
  const json header = in_file(path, [&] {
    try {
      return json_input::parse(std::string_view(bytes).substr(8, n));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("header ") + e.what());
    }
  });
  if (!header.is_object()) fail(path, "header is " + excerpt(header) + ", not a JSON object");
  const char* data = bytes.data() + 8 + n;
  const std::uint64_t data_size = bytes.size() - 8 - n;
  TensorMap out;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    out[name] = read_tensor(path, name, info, data, data_size, ranges);
  }
  check_overlaps(path, ranges);
  return out;
}

void write_safetensors(const std::string& path, const TensorMap& tensors) {
  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const std::uint64_t bytes = t.data.size() * 4;
    header[name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  const std::string h = header.dump();
  std::ofstream out(path, std::ios::binary);
  if (!out) throw InvalidArgument("cannot write '" + path + "'");
  std::uint64_t n = h.size();
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors) {
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size() * 4));
  }
  if (!out) throw InvalidArgument("writing '" + path + "' failed");
}

ModelConfig read_hf_config(const std::string& path) {
  try {
    const json j = json_input::parse(json_input::read_regular_file(path, kMaxConfigBytes));
    if (!j.is_object()) throw InvalidArgument("it is " + excerpt(j) + ", not a JSON object");
    ModelConfig c;
    c.name = j.value("model_type", std::string("llama"));
    c.vocab_size = json_input::to_uint<std::uint32_t>(j.at("vocab_size"), "vocab_size");
    c.hidden_size = json_input::to_uint<std::uint32_t>(j.at("hidden_size"), "hidden_size");
    c.intermediate_size =
        json_input::to_uint<std::uint32_t>(j.at("intermediate_size"), "intermediate_size");
    c.num_layers =
        json_input::to_uint<std::uint32_t>(j.at("num_hidden_layers"), "num_hidden_layers");
    c.n_q_heads =
        json_input::to_uint<std::uint32_t>(j.at("num_attention_heads"), "num_attention_heads");
    c.n_kv_heads = json_uint_or<std::uint32_t>(j, "num_key_value_heads", c.n_q_heads);
    c.head_dim =
        json_uint_or<std::uint32_t>(j, "head_dim", c.n_q_heads ? c.hidden_size / c.n_q_heads : 0u);
    c.rope_theta = json_float_or(j, "rope_theta", 10000.0f);
    c.rms_norm_eps = json_float_or(j, "rms_norm_eps", 1e-6f);
    c.max_position = json_uint_or<std::uint32_t>(j, "max_position_embeddings", 4096u);
    c.tie_word_embeddings = j.value("tie_word_embeddings", false);
    c.validate();
    return c;
  } catch (const json::exception& e) {
    throw InvalidArgument("config " + printable(path, json_input::kMaxPathEcho) + ": " +
                          json_input::bounded(e.what(), json_input::kMaxParserMessage));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("config " + printable(path, json_input::kMaxPathEcho) + ": " + e.what());
  }
}

Model load_model(const std::string& config_path, const std::string& weights_path) {
  const ModelConfig c = read_hf_config(config_path);
  TensorMap m = read_safetensors(weights_path);
  const std::uint64_t h = c.hidden_size, qd = std::uint64_t{c.n_q_heads} * c.head_dim,
                      kvd = std::uint64_t{c.n_kv_heads} * c.head_dim, f = c.intermediate_size;
  const std::string& p = weights_path;
  ModelWeights w;
  w.embed_tokens = take(p, m, "model.embed_tokens.weight", {c.vocab_size, h});
  for (std::uint32_t l = 0; l < c.num_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    LayerWeights lw;
    lw.input_norm = take(p, m, pre + "input_layernorm.weight", {h});
    lw.q_proj = take(p, m, pre + "self_attn.q_proj.weight", {qd, h});
    lw.k_proj = take(p, m, pre + "self_attn.k_proj.weight", {kvd, h});
    lw.v_proj = take(p, m, pre + "self_attn.v_proj.weight", {kvd, h});
    lw.o_proj = take(p, m, pre + "self_attn.o_proj.weight", {h, qd});
    lw.post_norm = take(p, m, pre + "post_attention_layernorm.weight", {h});
    lw.gate_proj = take(p, m, pre + "mlp.gate_proj.weight", {f, h});
    lw.up_proj = take(p, m, pre + "mlp.up_proj.weight", {f, h});
    lw.down_proj = take(p, m, pre + "mlp.down_proj.weight", {h, f});
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = take(p, m, "model.norm.weight", {h});
  if (!c.tie_word_embeddings) w.lm_head = take(p, m, "lm_head.weight", {c.vocab_size, h});
  return Model(c, std::move(w));
}

Model load_model(const std::string& dir) {
  return load_model(dir + "/config.json", dir + "/model.safetensors");
}

void save_model(const Model& model, const std::string& dir) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const std::uint64_t h = c.hidden_size, qd = std::uint64_t{c.n_q_heads} * c.head_dim,
                      kvd = std::uint64_t{c.n_kv_heads} * c.head_dim, f = c.intermediate_size;
  TensorMap m;
  m["model.embed_tokens.weight"] = {{c.vocab_size, h}, w.embed_tokens};
  for (std::uint32_t l = 0; l < c.num_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    const LayerWeights& lw = w.layers[l];
    m[pre + "input_layernorm.weight"] = {{h}, lw.input_norm};
    m[pre + "self_attn.q_proj.weight"] = {{qd, h}, lw.q_proj};
    m[pre + "self_attn.k_proj.weight"] = {{kvd, h}, lw.k_proj};
    m[pre + "self_attn.v_proj.weight"] = {{kvd, h}, lw.v_proj};
    m[pre + "self_attn.o_proj.weight"] = {{h, qd}, lw.o_proj};
    m[pre + "post_attention_layernorm.weight"] = {{h}, lw.post_norm};
    m[pre + "mlp.gate_proj.weight"] = {{f, h}, lw.gate_proj};
    m[pre + "mlp.up_proj.weight"] = {{f, h}, lw.up_proj};
    m[pre + "mlp.down_proj.weight"] = {{h, f}, lw.down_proj};
  }
  m["model.norm.weight"] = {{h}, w.final_norm};
  if (!c.tie_word_embeddings) m["lm_head.weight"] = {{c.vocab_size, h}, w.lm_head};
  write_safetensors(dir + "/model.safetensors", m);
  json j = {{"model_type", "llama"},
            {"architectures", {"LlamaForCausalLM"}},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.n_q_heads},
            {"num_key_value_heads", c.n_kv_heads},
            {"head_dim", c.head_dim},
            {"rope_theta", c.rope_theta},
            {"rms_norm_eps", c.rms_norm_eps},
            {"max_position_embeddings", c.max_position},
            {"tie_word_embeddings", c.tie_word_embeddings}};
  std::ofstream out(dir + "/config.json");
  out << j.dump(2) << '\n';
  if (!out) throw InvalidArgument("writing '" + dir + "/config.json' failed");
}

}  // namespace kvcache::engine
