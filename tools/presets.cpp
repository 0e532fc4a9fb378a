// tools/presets.cpp — the command line's one model-preset table (presets.h).
#include "presets.h"

#include "kvcache/error.h"

namespace kvcache::tools {

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = [] {
    std::vector<ModelPreset> out;
    for (std::string_view name : engine::model_preset_names()) {
      const engine::ModelConfig c = engine::model_preset(name);
      out.push_back({name, c.num_layers, c.n_q_heads, c.n_kv_heads, c.head_dim, true});
    }
    // Published models: layers, query heads, KV heads, head dim.
    const ModelPreset published[] = {
        {"llama-3-8b", 32, 32, 8, 128, false},    {"llama-3-70b", 80, 64, 8, 128, false},
        {"mistral-7b", 32, 32, 8, 128, false},    {"qwen2.5-7b", 28, 28, 4, 128, false},
        {"llama-2-7b", 32, 32, 32, 128, false},   {"gemma-2-9b", 42, 16, 8, 256, false},
        {"tinyllama-1.1b", 22, 32, 4, 64, false},
    };
    out.insert(out.end(), std::begin(published), std::end(published));
    return out;
  }();
  return presets;
}

std::string preset_names() {
  std::string names;
  for (const ModelPreset& p : model_presets())
    names += (names.empty() ? "" : ", ") + std::string(p.name);
  return names;
}

const ModelPreset& find_preset(std::string_view name) {
  for (const ModelPreset& p : model_presets())
    if (p.name == name) return p;
  throw InvalidArgument("unknown preset '" + std::string(name) + "' (known: " + preset_names() +
                        ")");
}

engine::ModelConfig engine_model_config(const ModelPreset& preset) {
  if (preset.engine_model) return engine::model_preset(preset.name);
  engine::ModelConfig c = engine::model_preset("small");  // hidden size, MLP, vocabulary
  c.name = std::string(preset.name);
  c.num_layers = kStandInLayers;
  c.n_q_heads = preset.n_q_heads;
  c.n_kv_heads = preset.n_kv_heads;
  c.head_dim = preset.head_dim;
  c.validate();
  return c;
}

std::string stand_in_note(const ModelPreset& preset) {
  if (preset.engine_model) return "";
  const engine::ModelConfig small = engine::model_preset("small");
  return "stand-in for " + std::string(preset.name) + ": its attention geometry (" +
         std::to_string(preset.n_q_heads) + " query / " + std::to_string(preset.n_kv_heads) +
         " KV heads, head dim " + std::to_string(preset.head_dim) + ") in " +
         std::to_string(kStandInLayers) + " of its " + std::to_string(preset.num_layers) +
         " layers, with small's hidden size " + std::to_string(small.hidden_size) +
         " and vocabulary " + std::to_string(small.vocab_size);
}

}  // namespace kvcache::tools
