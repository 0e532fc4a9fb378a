// tools/generate.cpp — `kvcache generate`: one request through the engine.
//
//   kvcache generate --prompt-tokens 1,2,3 --max-new-tokens 8 [--temperature 0.8 --top-p 0.9]
//                    [--samples 4] [--kv-dtype int8] [--compare f32]
// prints the generated token ids, comma separated: one line per sample
// (--samples n: the prompt computed once and forked, sample i seeded with
// seed + i), then its timing on stderr (prefill and decode tokens/s, wall
// time); --json prints one object with the tokens and the timing instead.
// Weights are seeded from a preset (presets.h: a published model runs as a
// stand-in), or loaded with --model DIR (config.json + model.safetensors). Refused (exit 2, naming
// the value and the limit): an empty prompt, and prompt + max-new-tokens past the model's
// max_position or past what 2^32 - 1 pages of the cache can index.
// --kv-dtype picks the cache's element type (f32 default; an fp8 cache gets
// static K/V scales calibrated on the prompt's first kCalibrationTokens
// tokens: Model::calibrate_kv_scales). --compare REF measures that cache
// against a REF cache instead of generating freely: engine::compare_kv_dtypes
// over --max-new-tokens positions, teacher-forced on REF's greedy tokens
// (largest logit difference, KL divergence, top-1 agreement).

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "kvcache/engine/kv_accuracy.h"
#include "kvcache/engine/model.h"
#include "kvcache/engine/safetensors.h"
#include "kvcache/engine/scheduler.h"
#include "kvcache/error.h"
#include "kvcache/paged_manager.h"
#include "presets.h"

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
  std::string kv_dtype = "f32";
  std::string compare;  // a reference dtype: compare instead of generating
  bool json = false;
};

// fp8 caches: the prompt tokens their static scales are calibrated on.
constexpr std::uint32_t kCalibrationTokens = 256;

// Where a run's time went: prefill = arrival to the first token (the prompt
// and the first sampled token), decode = first token to the last one, over
// every sample (the tokens after each sample's first).
struct Timing {
  std::uint64_t prompt_tokens = 0, decode_tokens = 0;
  double load_s = 0, prefill_s = 0, decode_s = 0, total_s = 0;
  double prefill_tokens_per_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0; }
  double decode_tokens_per_s() const { return decode_s > 0 ? decode_tokens / decode_s : 0; }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

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

Timing timing_of(const std::vector<engine::RequestOutput>& outs, std::size_t prompt_tokens) {
  Timing t;
  t.prompt_tokens = prompt_tokens;
  double arrival = outs.front().arrival_time, first = outs.front().first_token_time;
  double first_token_done = first, last = outs.front().finish_time;
  for (const engine::RequestOutput& out : outs) {
    arrival = std::min(arrival, out.arrival_time);
    first = std::min(first, out.first_token_time);
    first_token_done = std::max(first_token_done, out.first_token_time);
    last = std::max(last, out.finish_time);
    if (!out.tokens.empty()) t.decode_tokens += out.tokens.size() - 1;
  }
  t.prefill_s = first_token_done - arrival;
  t.decode_s = last - first_token_done;
  return t;
}

std::string token_line(const std::vector<engine::TokenId>& tokens) {
  std::string line;
  for (std::size_t i = 0; i < tokens.size(); ++i)
    line += (i ? "," : "") + std::to_string(tokens[i]);
  return line;
}

void report(const GenerateOptions& o, const std::vector<engine::RequestOutput>& outs,
            const Timing& t) {
  if (o.json) {
    nlohmann::json samples = nlohmann::json::array();
    for (const engine::RequestOutput& out : outs) samples.push_back(out.tokens);
    std::cout << nlohmann::json{{"samples", samples},
                                {"prompt_tokens", t.prompt_tokens},
                                {"decode_tokens", t.decode_tokens},
                                {"load_s", t.load_s},
                                {"prefill_s", t.prefill_s},
                                {"prefill_tokens_per_s", t.prefill_tokens_per_s()},
                                {"decode_s", t.decode_s},
                                {"decode_tokens_per_s", t.decode_tokens_per_s()},
                                {"total_s", t.total_s}}
                     .dump(2)
              << '\n';
    return;
  }
  for (const engine::RequestOutput& out : outs) std::cout << token_line(out.tokens) << '\n';
  std::cout.flush();  // the ids before the timing line where both go to one file
  std::fprintf(stderr,
               "prefill %llu tokens in %.1f ms (%.0f tokens/s), decode %llu tokens in %.1f ms "
               "(%.0f tokens/s); %.1f ms in all, %.1f ms of it loading or seeding the model\n",
               static_cast<unsigned long long>(t.prompt_tokens), t.prefill_s * 1e3,
               t.prefill_tokens_per_s(), static_cast<unsigned long long>(t.decode_tokens),
               t.decode_s * 1e3, t.decode_tokens_per_s(), t.total_s * 1e3, t.load_s * 1e3);
}

void run_compare(const GenerateOptions& o, const engine::Model& model,
                 const std::vector<engine::TokenId>& prompt) {
  if (o.samples != 1) {
    throw InvalidArgument("--compare runs one greedy sequence: --samples is " +
                          std::to_string(o.samples) + ", it must be 1");
  }
  (void)pages_per_sample(o, prompt.size(), model.config());  // the length checks
  engine::KVCompareOptions c;
  c.reference = parse_dtype(o.compare);
  c.dtype = parse_dtype(o.kv_dtype);
  c.page_size = o.page_size;
  c.calibration_tokens = kCalibrationTokens;
  const auto t0 = std::chrono::steady_clock::now();
  const engine::KVCompareReport r = engine::compare_kv_dtypes(model, prompt, o.max_new_tokens, c);
  const double seconds = seconds_since(t0);
  const std::string scales_note =
      is_fp8(r.dtype)
          ? "calibrated on the prompt's first " +
                std::to_string(std::min<std::size_t>(prompt.size(), kCalibrationTokens)) + " tokens"
          : "none";
  const nlohmann::json j{{"model", model.config().name},
                         {"kv_dtype", dtype_name(r.dtype)},
                         {"reference", dtype_name(r.reference)},
                         {"prompt_tokens", r.prompt_tokens},
                         {"positions", r.positions},
                         {"max_logit_diff", r.max_logit_diff},
                         {"mean_kl", r.mean_kl},
                         {"max_kl", r.max_kl},
                         {"top1_agreement", r.top1_agreement},
                         {"fp8_scales", scales_note},
                         {"seconds", seconds}};
  if (o.json) {
    std::cout << j.dump(2) << '\n';
    return;
  }
  std::printf(
      "%s cache against %s, %u positions (teacher-forced on %s's greedy tokens), model '%s':\n"
      "  largest logit difference %.4g\n  KL divergence mean %.3g, max %.3g nats\n"
      "  top-1 agreement %.4f\n",
      std::string(dtype_name(r.dtype)).c_str(), std::string(dtype_name(r.reference)).c_str(),
      r.positions, std::string(dtype_name(r.reference)).c_str(), model.config().name.c_str(),
      r.max_logit_diff, r.mean_kl, r.max_kl, r.top1_agreement);
}

void run_generate(const GenerateOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<engine::TokenId> prompt = parse_token_ids(o.prompt);
  const DType dtype = parse_dtype(o.kv_dtype);
  if (!o.compare.empty()) (void)parse_dtype(o.compare);
  const std::size_t prompt_tokens = prompt.size();
  const engine::Model model =
      o.model_dir.empty()
          ? engine::Model::from_seed(engine_model_config(find_preset(o.preset)), o.seed)
          : engine::load_model(o.model_dir);
  const double load_s = seconds_since(t0);
  if (!o.compare.empty()) {
    run_compare(o, model, prompt);
    return;
  }
  const std::uint32_t pages = pages_per_sample(o, prompt.size(), model.config());
  // Room for every sample at once (fewer would be enough: they share the prompt).
  PagedKVCacheManager manager(model.config().cache_params(CacheStrategy::paged, o.page_size, dtype),
                              pages * o.samples, o.samples, pages * o.page_size);
  if (is_fp8(dtype)) {
    const std::size_t n = std::min<std::size_t>(prompt.size(), kCalibrationTokens);
    manager.set_kv_scales(model.calibrate_kv_scales(std::span(prompt).first(n), dtype));
  }
  engine::SchedulerConfig config;
  config.max_num_seqs = o.samples;
  config.clock = [t0] { return seconds_since(t0); };
  engine::Scheduler scheduler(model, manager, config);
  engine::Request r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = o.max_new_tokens;
  r.end_token = o.end_token;
  r.sampling = {.temperature = o.temperature, .top_p = o.top_p, .seed = o.seed};
  r.n = o.samples;
  r.arrival_time = config.clock();
  scheduler.add_request(std::move(r));
  scheduler.run_to_completion();
  auto outs = scheduler.take_finished();
  std::sort(outs.begin(), outs.end(),
            [](const auto& a, const auto& b) { return a.sample_index < b.sample_index; });
  Timing t = timing_of(outs, prompt_tokens);
  t.load_s = load_s;
  t.total_s = seconds_since(t0);
  report(o, outs, t);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  static GenerateOptions o;
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens for one prompt of token ids");
  cmd->add_option("--prompt-tokens", o.prompt, "prompt token ids, e.g. 1,2,3")->required();
  cmd->add_option("--max-new-tokens", o.max_new_tokens,
                  "tokens to generate per sample (fewer if --end-token comes first)")
      ->capture_default_str();
  cmd->add_option("--end-token", o.end_token, "stop after this token id");
  cmd->add_option("--preset", o.preset,
                  "model preset (seeded weights): " + preset_names() +
                      " (a published model runs as a stand-in: its attention geometry in " +
                      std::to_string(kStandInLayers) + " layers, see README)")
      ->capture_default_str();
  cmd->add_option("--model", o.model_dir, "directory with config.json + model.safetensors");
  cmd->add_option("--temperature", o.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", o.top_p,
                  "nucleus sampling: sample from the smallest set of tokens whose probabilities "
                  "sum to this, in (0, 1]; 1 = all")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of the weights and of sampling")->capture_default_str();
  cmd->add_option("--page-size", o.page_size, "tokens per page of the paged KV cache")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--samples", o.samples,
                  "independent samples of the prompt (parallel sampling: the prompt is "
                  "computed once and forked; sample i uses seed + i)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  cmd->add_option("--kv-dtype", o.kv_dtype,
                  "KV cache element type: " + std::string(kDTypeNames) +
                      "; fp8 scales are calibrated on the prompt's first " +
                      std::to_string(kCalibrationTokens) + " tokens")
      ->capture_default_str();
  cmd->add_option("--compare", o.compare,
                  "a reference dtype (e.g. f32): instead of generating, compare the --kv-dtype "
                  "cache's logits with it over --max-new-tokens positions, teacher-forced on the "
                  "reference's greedy tokens (largest logit difference, KL divergence, top-1 "
                  "agreement)");
  cmd->add_flag("--json", o.json,
                "print one JSON object (samples, prefill/decode tokens/s, times; with --compare "
                "the figures) instead of token lines and a timing line on stderr");
  cmd->callback([] { run_generate(o); });
}

}  // namespace kvcache::tools
