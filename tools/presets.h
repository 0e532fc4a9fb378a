// tools/presets.h — the one model-preset namespace of the command line
// (`plan`, `tour`, `demo`, `generate`).
//
// One table: the engine's small models (tiny, small, base: the shapes of
// engine::model_preset) and published models' KV geometry (llama-3-8b,
// mistral-7b, ...). `plan` and `tour` use any preset's KV shape as is.
// `demo` and `generate` run the engine's models as they are; a published
// model runs as a *stand-in*: its attention geometry (query heads, KV heads,
// head dim, so the GQA ratio and the KV bytes per token per layer are the real
// model's) in kStandInLayers layers with the small model's hidden size, MLP
// and vocabulary, seeded weights. An 8B model's 32 layers of 4096-wide
// matrices would need 32 GB of fp32 weights and minutes per request on a
// CPU; the stand-in keeps what the cache sees and costs about what `small`
// does. Lookups throw kvcache::InvalidArgument listing the known names.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/engine/model.h"

namespace kvcache::tools {

// Layers a published model's stand-in runs in `demo` and `generate`.
inline constexpr std::uint32_t kStandInLayers = 2;

struct ModelPreset {
  std::string_view name;
  std::uint32_t num_layers;
  std::uint32_t n_q_heads;  // query heads
  std::uint32_t n_kv_heads;
  std::uint32_t head_dim;
  bool engine_model;  // one of the engine's own models (runs as is)
};

// Every preset: the engine's models first, then the published ones.
const std::vector<ModelPreset>& model_presets();
// Throws InvalidArgument naming `name` and listing the known names.
const ModelPreset& find_preset(std::string_view name);
// "tiny, small, base, llama-3-8b, ..." for help texts.
std::string preset_names();

// The model `demo` and `generate` run for a preset: the engine's model, or a
// published model's stand-in (see above; its name is the preset's).
engine::ModelConfig engine_model_config(const ModelPreset& preset);
// One line saying what runs: "" for an engine model, else what the
// stand-in keeps and what it scales.
std::string stand_in_note(const ModelPreset& preset);

}  // namespace kvcache::tools
