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

#include "kvcache/dtype.h"
#include "kvcache/error.h"

namespace kvcache::engine {
namespace {

using nlohmann::json;

// JSON numbers converted with range checks: nlohmann's get<> on an
// out-of-range or fractional value is an undefined float->int conversion.
template <class U>
U json_uint(const json& v, const std::string& field) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= std::numeric_limits<U>::max()) {
    return static_cast<U>(v.get<std::uint64_t>());
  }
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0 &&
      static_cast<std::uint64_t>(v.get<std::int64_t>()) <= std::numeric_limits<U>::max()) {
    return static_cast<U>(v.get<std::int64_t>());
  }
  throw InvalidArgument(field + " is " + v.dump() + ": expected an integer in [0, " +
                        std::to_string(std::numeric_limits<U>::max()) + "]");
}

template <class U>
U json_uint_or(const json& j, const char* field, U fallback) {
  return j.contains(field) ? json_uint<U>(j.at(field), field) : fallback;
}

float json_float_or(const json& j, const char* field, float fallback) {
  if (!j.contains(field)) return fallback;
  const json& v = j.at(field);
  if (!v.is_number() || !std::isfinite(v.get<double>()) ||
      std::fabs(v.get<double>()) > std::numeric_limits<float>::max()) {
    throw InvalidArgument(std::string(field) + " is " + v.dump() + ": expected a finite float");
  }
  return static_cast<float>(v.get<double>());
}

std::vector<std::uint64_t> json_uint_list(const json& v, const std::string& field) {
  if (!v.is_array()) throw InvalidArgument(field + " is " + v.dump() + ": expected an array");
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    out.push_back(json_uint<std::uint64_t>(v[i], field + "[" + std::to_string(i) + "]"));
  }
  return out;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InvalidArgument("safetensors " + path + ": " + what);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument("cannot open '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::size_t element_size(const std::string& path, const std::string& name,
                         const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  fail(path, "tensor '" + name + "' has unsupported dtype '" + dtype + "' (F32, F16, BF16)");
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

Tensor read_tensor(const std::string& path, const std::string& name, const json& info,
                   const char* data, std::uint64_t data_size,
                   std::vector<std::pair<std::uint64_t, std::uint64_t>>& ranges) {
  if (!info.is_object()) fail(path, "entry '" + name + "' is not an object");
  Tensor t;
  std::string dtype;
  std::uint64_t begin = 0, end = 0;
  try {
    dtype = info.at("dtype").get<std::string>();
    t.shape = json_uint_list(info.at("shape"), name + " shape");
    const auto offs = json_uint_list(info.at("data_offsets"), name + " data_offsets");
    if (offs.size() != 2) fail(path, "tensor '" + name + "' data_offsets needs 2 values");
    begin = offs[0], end = offs[1];
  } catch (const json::exception& e) {
    fail(path, "tensor '" + name + "': " + e.what());
  }
  const std::size_t esize = element_size(path, name, dtype);
  std::uint64_t count = 1;
  for (std::uint64_t d : t.shape) {
    if (d != 0 && count > (std::uint64_t{1} << 40) / d)
      fail(path, "tensor '" + name + "' too large");
    count *= d;
  }
  if (begin > end || end > data_size) {
    fail(path, "tensor '" + name + "' data_offsets [" + std::to_string(begin) + ", " +
                   std::to_string(end) + ") outside the " + std::to_string(data_size) +
                   " data bytes");
  }
  if (end - begin != count * esize) {
    fail(path, "tensor '" + name + "' has " + std::to_string(end - begin) +
                   " bytes, its shape and dtype need " + std::to_string(count * esize));
  }
  ranges.emplace_back(begin, end);
  t.data = convert(data + begin, count, dtype);
  return t;
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
  if (it == m.end()) fail(path, "missing tensor '" + name + "'");
  if (it->second.shape != shape) {
    std::string want, got;
    for (auto d : shape) want += std::to_string(d) + ",";
    for (auto d : it->second.shape) got += std::to_string(d) + ",";
    fail(path, "tensor '" + name + "' has shape [" + got + "], config.json needs [" + want + "]");
  }
  return std::move(it->second.data);
}

}  // namespace

TensorMap read_safetensors(const std::string& path) {
  const std::string bytes = read_all(path);
  if (bytes.size() < 8) fail(path, "file has " + std::to_string(bytes.size()) + " bytes, < 8");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > bytes.size() - 8) {
    fail(path, "header length " + std::to_string(n) + " exceeds the " +
                   std::to_string(bytes.size() - 8) + " bytes after it");
  }
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");
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
  json j;
  try {
    j = json::parse(read_all(path));
    ModelConfig c;
    c.name = j.value("model_type", std::string("llama"));
    c.vocab_size = json_uint<std::uint32_t>(j.at("vocab_size"), "vocab_size");
    c.hidden_size = json_uint<std::uint32_t>(j.at("hidden_size"), "hidden_size");
    c.intermediate_size = json_uint<std::uint32_t>(j.at("intermediate_size"), "intermediate_size");
    c.num_layers = json_uint<std::uint32_t>(j.at("num_hidden_layers"), "num_hidden_layers");
    c.num_heads = json_uint<std::uint32_t>(j.at("num_attention_heads"), "num_attention_heads");
    c.num_kv_heads = json_uint_or<std::uint32_t>(j, "num_key_value_heads", c.num_heads);
    c.head_dim =
        json_uint_or<std::uint32_t>(j, "head_dim", c.num_heads ? c.hidden_size / c.num_heads : 0u);
    c.rope_theta = json_float_or(j, "rope_theta", 10000.0f);
    c.rms_norm_eps = json_float_or(j, "rms_norm_eps", 1e-6f);
    c.max_position = json_uint_or<std::uint32_t>(j, "max_position_embeddings", 4096u);
    c.tie_word_embeddings = j.value("tie_word_embeddings", false);
    c.validate();
    return c;
  } catch (const json::exception& e) {
    throw InvalidArgument("config " + path + ": " + e.what());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("config " + path + ": " + e.what());
  }
}

Model load_model(const std::string& config_path, const std::string& weights_path) {
  const ModelConfig c = read_hf_config(config_path);
  TensorMap m = read_safetensors(weights_path);
  const std::uint64_t h = c.hidden_size, qd = std::uint64_t{c.num_heads} * c.head_dim,
                      kvd = std::uint64_t{c.num_kv_heads} * c.head_dim, f = c.intermediate_size;
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
  const std::uint64_t h = c.hidden_size, qd = std::uint64_t{c.num_heads} * c.head_dim,
                      kvd = std::uint64_t{c.num_kv_heads} * c.head_dim, f = c.intermediate_size;
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
            {"num_attention_heads", c.num_heads},
            {"num_key_value_heads", c.num_kv_heads},
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
