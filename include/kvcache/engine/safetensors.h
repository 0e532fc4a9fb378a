// kvcache/engine/safetensors.h — loading (and saving) Hugging Face Llama
// checkpoints: a config.json plus one .safetensors file.
//
// safetensors layout: 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?},
// then the raw little-endian data; offsets are relative to the data start.
// F32, F16 and BF16 tensors are read (converted to f32). Tensor names follow
// HF Llama: model.embed_tokens.weight, model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
// model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.layers.{i}.input_layernorm.weight,
// model.layers.{i}.post_attention_layernorm.weight, model.norm.weight, lm_head.weight
// (absent when tie_word_embeddings).
// Everything malformed — a path that is not a regular file (a directory,
// /dev/zero, a pipe), short file, header past the end or past the format's
// 100,000,000 bytes, a config.json over 16 MiB, bad JSON or JSON nested more
// than 64 levels deep (refused while parsing: nothing recurses per level),
// a number that is not an integer in range, unknown dtype, more than 16
// dimensions, offsets outside the data or not matching the shape, overlapping
// tensors, a missing tensor or a shape that disagrees with config.json —
// throws InvalidArgument naming the file, the tensor and the numbers. Values
// echoed in a message are described in at most 64 bytes ("an array of 3000000
// elements") with control characters escaped (a NUL in a name shows as \u0000).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kvcache/engine/model.h"

namespace kvcache::engine {

struct Tensor {
  std::vector<std::uint64_t> shape;
  std::vector<float> data;
};

using TensorMap = std::map<std::string, Tensor>;

TensorMap read_safetensors(const std::string& path);
// Writes F32 tensors (used by tests and `save_model`).
void write_safetensors(const std::string& path, const TensorMap& tensors);

// Parses HF LlamaConfig fields: vocab_size, hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, num_key_value_heads (default:
// num_attention_heads), head_dim (default hidden/heads), rope_theta,
// rms_norm_eps, max_position_embeddings, tie_word_embeddings.
ModelConfig read_hf_config(const std::string& config_json_path);

// dir/config.json + dir/model.safetensors.
Model load_model(const std::string& dir);
Model load_model(const std::string& config_json_path, const std::string& safetensors_path);
// Writes dir/config.json + dir/model.safetensors for `model` (dir must exist).
void save_model(const Model& model, const std::string& dir);

}  // namespace kvcache::engine
