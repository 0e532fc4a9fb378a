// tools/generate.cpp — `kvcache generate`: one request through the engine.
//
//   kvcache generate --prompt-tokens 1,2,3 --max-new-tokens 8 [--temperature 0.8 --top-p 0.9]
//                    [--samples 4]
// prints the generated token ids, comma separated: one line per sample
// (--samples n: the prompt computed once and forked, sample i seeded with
// seed + i). Weights are seeded from a preset, or loaded with --model DIR
// (config.json + model.safetensors). Refused (exit 2, naming the value and
// the limit): an empty prompt, and prompt + max-new-tokens past the model's
// max_position or past what 2^32 - 1 pages of the cache can index.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "kvcache/engine/model.h"
#include "kvcache/engine/safetensors.h"
#include "kvcache/engine/scheduler.h"
#include "kvcache/error.h"
#include "kvcache/paged_manager.h"

namespace kvcache::tools {
namespace {

struct GenerateOptions {
  std::string preset = "tiny";
  std::string model_dir;
  std::string prompt;  // "1,2,3": parse_token_ids
  std::uint32_t max_new_tokens = 16;
  std::optional<engine::TokenId> end_token;
  float temperature = 0.0f, top_p = 1.0f;
  std::uint64_t seed = 1;
  std::uint32_t page_size = 16;
  std::uint32_t samples = 1;
};

// "1,2,3" -> {1, 2, 3}. Every comma-separated field must be a decimal
// integer in [0, 2^31 - 1]: an empty text or field ("", "1,,2") is refused
// rather than read as token 0 (the scheduler then checks the vocabulary).
std::vector<engine::TokenId> parse_token_ids(const std::string& text) {
  if (text.empty()) throw InvalidArgument("--prompt-tokens is empty: give at least one token id");
  std::vector<engine::TokenId> ids;
  for (std::size_t begin = 0; begin <= text.size();) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string field = text.substr(begin, end - begin);
    engine::TokenId id = 0;
    const auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), id);
    if (field.empty() || ec != std::errc() || ptr != field.data() + field.size() || id < 0) {
      throw InvalidArgument("--prompt-tokens field " + std::to_string(ids.size() + 1) + " '" +
                            field + "' is not a token id in [0, " +
                            std::to_string(std::numeric_limits<engine::TokenId>::max()) + "]");
    }
    ids.push_back(id);
    begin = end + 1;
  }
  return ids;
}

// Pages per sample for the whole request: prompt + max_new_tokens tokens,
// computed in 64 bits and checked against the model and the cache's 32 bits.
std::uint32_t pages_per_sample(const GenerateOptions& o, std::size_t prompt_tokens,
                               const engine::ModelConfig& model) {
  const std::uint64_t len = std::uint64_t{prompt_tokens} + o.max_new_tokens;
  if (len > model.max_position) {
    throw InvalidArgument("prompt " + std::to_string(prompt_tokens) + " + --max-new-tokens " +
                          std::to_string(o.max_new_tokens) + " = " + std::to_string(len) +
                          " tokens exceeds the model's max_position " +
                          std::to_string(model.max_position));
  }
  const std::uint64_t pages = (len + o.page_size - 1) / o.page_size;
  if (pages * o.samples * o.page_size > std::numeric_limits<std::uint32_t>::max()) {
    throw InvalidArgument(std::to_string(o.samples) + " samples of " + std::to_string(len) +
                          " tokens in pages of " + std::to_string(o.page_size) +
                          " need more than 2^32 - 1 cache tokens");
  }
  return static_cast<std::uint32_t>(pages);
}

void run_generate(const GenerateOptions& o) {
  std::vector<engine::TokenId> prompt = parse_token_ids(o.prompt);
  const engine::Model model = o.model_dir.empty()
                                  ? engine::Model::from_seed(engine::model_preset(o.preset), o.seed)
                                  : engine::load_model(o.model_dir);
  const std::uint32_t pages = pages_per_sample(o, prompt.size(), model.config());
  // Room for every sample at once (fewer would be enough: they share the prompt).
  PagedKVCacheManager manager(model.config().cache_params(CacheStrategy::paged, o.page_size),
                              pages * o.samples, o.samples, pages * o.page_size);
  engine::SchedulerConfig config;
  config.max_num_seqs = o.samples;
  engine::Scheduler scheduler(model, manager, config);
  engine::Request r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = o.max_new_tokens;
  r.end_token = o.end_token;
  r.sampling = {.temperature = o.temperature, .top_p = o.top_p, .seed = o.seed};
  r.n = o.samples;
  scheduler.add_request(std::move(r));
  scheduler.run_to_completion();
  auto outs = scheduler.take_finished();
  std::sort(outs.begin(), outs.end(),
            [](const auto& a, const auto& b) { return a.sample_index < b.sample_index; });
  for (const engine::RequestOutput& out : outs) {
    for (std::size_t i = 0; i < out.tokens.size(); ++i) {
      std::cout << (i ? "," : "") << out.tokens[i];
    }
    std::cout << '\n';
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  static GenerateOptions o;
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens for one prompt of token ids");
  cmd->add_option("--prompt-tokens", o.prompt, "prompt token ids, e.g. 1,2,3")->required();
  cmd->add_option("--max-new-tokens", o.max_new_tokens)->capture_default_str();
  cmd->add_option("--end-token", o.end_token, "stop after this token id");
  cmd->add_option("--preset", o.preset, "model preset (seeded weights)")->capture_default_str();
  cmd->add_option("--model", o.model_dir, "directory with config.json + model.safetensors");
  cmd->add_option("--temperature", o.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", o.top_p)->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of the weights and of sampling")->capture_default_str();
  cmd->add_option("--page-size", o.page_size)->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--samples", o.samples,
                  "independent samples of the prompt (parallel sampling: the prompt is "
                  "computed once and forked; sample i uses seed + i)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  cmd->callback([] { run_generate(o); });
}

}  // namespace kvcache::tools
