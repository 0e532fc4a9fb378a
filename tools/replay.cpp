// tools/replay.cpp — `kvcache replay`: replay a Mooncake-format JSONL trace
// against the paged manager's prefix cache and report hit rates, for one or
// several (policy, capacity) pairs (replay.h). The trace is read once, with
// every number checked (kvcache/engine/trace_file.h); capacities are read by
// parse_token_count (kvcache/engine/units.h); the other flags are checked
// by replay_trace (kvcache/replay/trace_replay.h). Output: a table, --json,
// --format csv (stdout), --csv FILE, --plot FILE.svg|.png; with tiers, the
// hits per medium and the modelled TTFT beside them. Bad input: exit 2 with
// a message naming it.

#include "replay.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "commands.h"
#include "kvcache/engine/trace_file.h"
#include "kvcache/error.h"
#include "progress.h"
#include "replay_media.h"
#include "table.h"

namespace kvcache::tools {

namespace {

// Every field of a comma-separated list; an empty field is refused.
std::vector<std::string> split_list(std::string_view text, const char* flag) {
  std::vector<std::string> fields;
  for (std::size_t begin = 0; begin <= text.size();) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    if (end == begin) {
      throw InvalidArgument(std::string(flag) + " '" + std::string(text) + "' has an empty field " +
                            std::to_string(fields.size() + 1));
    }
    fields.emplace_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return fields;
}

void check_runs(std::size_t policies, std::size_t capacities) {
  if (policies * capacities > kMaxReplayRuns) {
    throw InvalidArgument(std::to_string(policies) + " policies x " + std::to_string(capacities) +
                          " capacities is past the limit of " + std::to_string(kMaxReplayRuns) +
                          " runs");
  }
}

}  // namespace

std::vector<std::uint64_t> parse_capacity_list(std::string_view text) {
  std::vector<std::uint64_t> out;
  for (const std::string& field : split_list(text, "--capacity"))
    out.push_back(engine::parse_token_count(field));
  check_runs(1, out.size());
  return out;
}

std::vector<std::string> parse_policy_list(std::string_view text) {
  std::vector<std::string> out = split_list(text, "--policy");
  for (const std::string& p : out)
    if (p != "belady") (void)parse_policy(p);  // throws naming the name
  check_runs(out.size(), 1);
  return out;
}

std::vector<ReplayRun> run_replays(std::span<const TraceRequest> trace, const ReplayOptions& base,
                                   const std::vector<std::string>& policies,
                                   const std::vector<std::uint64_t>& capacities,
                                   const ReplayProgress& progress) {
  check_runs(policies.size(), capacities.size());
  for (const std::string& p : policies) {
    if (p == "belady" && !base.sequential)
      throw InvalidArgument("--policy belady (the offline optimum) needs --sequential");
    if (p == "belady" && base.tiers.any())
      throw InvalidArgument("--policy belady (the offline optimum) replays no tiers");
  }
  if (!base.tiers.disk_dir.empty() && policies.size() * capacities.size() > 1) {
    throw InvalidArgument("--disk-dir '" + base.tiers.disk_dir + "' takes one run, not " +
                          std::to_string(policies.size() * capacities.size()) +
                          " (policy, capacity) pairs: each would start from the last one's disk");
  }
  std::vector<ReplayRun> runs;
  for (const std::string& policy : policies) {
    for (std::uint64_t capacity : capacities) {
      ReplayRun run{policy, capacity, {}};
      ReplayOptions o = base;
      o.capacity_tokens = capacity;
      o.offline_belady = policy == "belady";
      if (!o.offline_belady) o.policy = parse_policy(policy);
      const std::size_t total = policies.size() * capacities.size();
      if (progress) o.progress = progress(runs.size(), total, run);
      run.result = replay_trace(trace, o);
      runs.push_back(std::move(run));
    }
  }
  return runs;
}

namespace {

std::string f6(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6f", v);
  return buf;
}

// The media columns of one run (names from the first run's media).
void csv_media(std::ostream& o, const ReplayResult& r, std::size_t media, const TtftModel& model) {
  const TtftEstimate e = estimate_ttft(r, model);
  for (std::size_t i = 0; i < media; ++i) {
    if (i >= r.media.size()) {
      o << ",,,,,,,,";
      continue;
    }
    const ReplayMedium& m = r.media[i];
    o << ',' << f6(r.hit_share(i)) << ',' << f6(r.medium_block_hit_rate(i)) << ',' << m.pages_hit
      << ',' << m.pages_stored << ',' << m.bytes_stored << ',' << m.pages_loaded << ','
      << m.bytes_loaded << ',' << f6(e.saving_s[i] * 1e3);
  }
  o << ',' << f6(e.without_cache_s * 1e3) << ',' << f6(e.with_cache_s * 1e3);
}

}  // namespace

std::string replay_csv(const std::vector<ReplayRun>& runs, std::uint32_t page_size,
                       const TtftModel& model) {
  const std::size_t media = runs.empty() ? 0 : runs[0].result.media.size();
  const bool tiers = media > 1;
  std::ostringstream o;
  o << "policy,capacity_tokens,capacity_pages,page_size,requests,rejected,block_hit_rate,"
       "token_hit_rate,blocks_total,blocks_hit,evictions,peak_pages_used,"
       "manager_ns_per_request";
  for (std::size_t i = 0; tiers && i < media; ++i) {
    const std::string& m = runs[0].result.media[i].name;
    for (const char* col : {"_hit_share", "_block_hit_rate", "_pages_hit", "_pages_stored",
                            "_bytes_stored", "_pages_loaded", "_bytes_loaded", "_ttft_saving_ms"})
      o << ',' << m << col;
  }
  if (tiers) o << ",ttft_ms_without_cache,ttft_ms_with_cache";
  o << '\n';
  for (const ReplayRun& run : runs) {
    const ReplayResult& r = run.result;
    o << run.policy << ',' << run.capacity_tokens << ',' << r.capacity_pages << ',' << page_size
      << ',' << r.requests << ',' << r.rejected << ',' << f6(r.block_hit_rate()) << ','
      << f6(r.token_hit_rate()) << ',' << r.blocks_total << ',' << r.blocks_hit << ','
      << r.evictions << ',' << r.peak_pages_used << ','
      << static_cast<std::uint64_t>(r.ns_per_request() + 0.5);
    if (tiers) csv_media(o, r, media, model);
    o << '\n';
  }
  return o.str();
}

LineChart replay_chart(const std::vector<ReplayRun>& runs, const std::string& trace_name) {
  LineChart chart{"Prefix-cache block hit rate: " + trace_name,
                  "cache capacity (tokens)",
                  "block hit rate",
                  {}};
  for (const ReplayRun& run : runs) {
    auto it = std::find_if(chart.series.begin(), chart.series.end(),
                           [&](const PlotSeries& s) { return s.name == run.policy; });
    if (it == chart.series.end())
      it = chart.series.insert(chart.series.end(), PlotSeries{run.policy, {}, {}});
    it->x.push_back(static_cast<double>(run.capacity_tokens));
    it->y.push_back(run.result.block_hit_rate());
  }
  return chart;
}

namespace {

struct ReplayArgs {
  std::string trace;
  std::uint32_t page_size = 512;
  std::string capacity = "unlimited";
  std::string policy = "lru";
  double small_fraction = 0.1;
  double ghost_factor = 16.0;
  bool sequential = false;
  double rate = 20.0;
  std::uint32_t max_batch = 1024;
  bool reuse_hints = false;
  std::uint32_t short_output = 32;
  std::string host_capacity;  // empty: no host tier
  std::string disk_dir;       // empty: no disk tier
  std::string disk_capacity;  // empty: unlimited
  std::string admission = "every_page";
  double prefill_tflops = TtftModel{}.flops_per_s / 1e12;
  double host_gbps = TtftModel{}.host_bytes_per_s / 1e9;
  double disk_gbps = TtftModel{}.disk_bytes_per_s / 1e9;
  bool json = false;
  std::string format = "table";
  std::string csv;
  std::string plot;
};

// --host-capacity, --disk-dir, --disk-capacity as ReplayTiers.
ReplayTiers tier_options(const ReplayArgs& a) {
  ReplayTiers t;
  if (!a.host_capacity.empty()) {
    t.host_capacity_tokens = engine::parse_token_count(a.host_capacity);
    if (t.host_capacity_tokens == 0) {
      throw InvalidArgument("--host-capacity '" + a.host_capacity +
                            "': the host tier needs a bounded token count");
    }
  }
  if (!a.disk_capacity.empty() && a.disk_dir.empty()) {
    throw InvalidArgument("--disk-capacity '" + a.disk_capacity + "' needs --disk-dir");
  }
  t.disk_dir = a.disk_dir;
  if (!a.disk_capacity.empty()) t.disk_capacity_tokens = engine::parse_token_count(a.disk_capacity);
  if (a.admission != "every_page" && a.admission != "reused") {
    throw InvalidArgument("--admission '" + a.admission + "' is not every_page or reused");
  }
  t.admission = a.admission == "reused" ? OffloadAdmission::reused : OffloadAdmission::every_page;
  return t;
}

TtftModel ttft_model(const ReplayArgs& a) {
  TtftModel m;
  m.flops_per_s = a.prefill_tflops * 1e12;
  m.host_bytes_per_s = a.host_gbps * 1e9;
  m.disk_bytes_per_s = a.disk_gbps * 1e9;
  (void)estimate_ttft(ReplayResult{}, m);  // throws naming a value that is not > 0
  return m;
}

std::string capacity_text(std::uint64_t tokens) {
  return tokens == 0 ? "unlimited" : with_commas(tokens);
}

nlohmann::json to_json(const ReplayArgs& a, const ReplayRun& run) {
  const ReplayResult& r = run.result;
  const ReplayTiers t = tier_options(a);
  nlohmann::json j = {{"trace", a.trace},
                      {"mode", a.sequential ? "sequential" : "timed"},
                      {"policy", run.policy},
                      {"reuse_hints", a.reuse_hints},
                      {"short_output", a.short_output},
                      {"page_size", a.page_size},
                      {"capacity_tokens", run.capacity_tokens},
                      {"capacity_pages", r.capacity_pages},
                      {"requests", r.requests},
                      {"rejected", r.rejected},
                      {"block_hit_rate", r.block_hit_rate()},
                      {"token_hit_rate", r.token_hit_rate()},
                      {"blocks_total", r.blocks_total},
                      {"blocks_hit", r.blocks_hit},
                      {"evictions", r.evictions},
                      {"peak_pages_used", r.peak_pages_used},
                      {"manager_ns_per_request", r.ns_per_request()},
                      {"tiers",
                       {{"host_capacity_tokens", t.host_capacity_tokens},
                        {"disk_dir", t.disk_dir},
                        {"disk_capacity_tokens", t.disk_capacity_tokens},
                        {"admission", a.admission}}},
                      {"tier_wait_ns_per_request",
                       r.requests == 0 ? 0.0 : double(r.tier_wait_ns) / double(r.requests)}};
  j.update(media_json(r, ttft_model(a)));
  return j;
}

std::string fixed(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

void print_heading(const ReplayArgs& a, std::size_t requests) {
  std::printf("replay %s: %zu requests, %s mode, page size %u%s\n", a.trace.c_str(), requests,
              a.sequential ? "sequential" : "timed", a.page_size,
              a.reuse_hints ? (", reuse hints (output < " + std::to_string(a.short_output) +
                               " tokens: likely)")
                                  .c_str()
                            : "");
  const ReplayTiers t = tier_options(a);
  if (!t.any()) return;
  std::string tiers = "tiers:";
  if (t.host_capacity_tokens > 0)
    tiers += " host " + with_commas(t.host_capacity_tokens) + " tokens";
  if (!t.disk_dir.empty()) {
    tiers += (t.host_capacity_tokens > 0 ? " (writing through to the disk), disk " : " disk ") +
             t.disk_dir + " " +
             (t.disk_capacity_tokens == 0 ? "unlimited"
                                          : with_commas(t.disk_capacity_tokens) + " tokens");
  }
  std::printf("%s\n", tiers.c_str());
}

// One run: a metric / value table, and with tiers the hits per medium.
void print_one(const ReplayRun& run, const TtftModel& model) {
  const ReplayResult& r = run.result;
  std::printf("policy %s, capacity %s tokens = %s pages\n", run.policy.c_str(),
              capacity_text(run.capacity_tokens).c_str(), with_commas(r.capacity_pages).c_str());
  Table t({"metric", "value"});
  t.add_row({"block_hit_rate", fixed("%.4f", r.block_hit_rate())});
  t.add_row({"token_hit_rate", fixed("%.4f", r.token_hit_rate())});
  t.add_row({"evictions", with_commas(r.evictions)});
  t.add_row({"peak pages in use", with_commas(r.peak_pages_used)});
  t.add_row({"rejected requests", with_commas(r.rejected)});
  t.add_row({"manager ns / request", fixed("%.0f", r.ns_per_request())});
  if (r.media.back().name == "disk")
    t.add_row({"pages found on the disk at start", with_commas(r.media.back().pages_at_start)});
  if (r.media.size() > 1) {
    t.add_row({"tier wait ms / request",
               fixed("%.3f", r.requests == 0 ? 0.0 : 1e-6 * double(r.tier_wait_ns) / r.requests)});
  }
  t.print(std::cout);
  if (r.media.size() > 1) print_media(std::cout, r, model);
}

// Several runs: one row each (with tiers, each medium's block hit rate too).
void print_sweep(const std::vector<ReplayRun>& runs) {
  std::vector<std::string> header = {"policy",     "capacity (tokens)", "pages",
                                     "block hit",  "token hit",         "evictions",
                                     "peak pages", "rejected",          "ns/request"};
  const std::size_t media = runs[0].result.media.size() > 1 ? runs[0].result.media.size() : 0;
  for (std::size_t i = 0; i < media; ++i) header.push_back(runs[0].result.media[i].name + " hit");
  Table t(header);
  for (const ReplayRun& run : runs) {
    const ReplayResult& r = run.result;
    std::vector<std::string> row = {run.policy,
                                    capacity_text(run.capacity_tokens),
                                    with_commas(r.capacity_pages),
                                    fixed("%.4f", r.block_hit_rate()),
                                    fixed("%.4f", r.token_hit_rate()),
                                    with_commas(r.evictions),
                                    with_commas(r.peak_pages_used),
                                    with_commas(r.rejected),
                                    fixed("%.0f", r.ns_per_request())};
    for (std::size_t i = 0; i < media; ++i)
      row.push_back(fixed("%.4f", r.medium_block_hit_rate(i)));
    t.add_row(std::move(row));
  }
  t.print(std::cout);
}

void write_file(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw InvalidArgument(std::string(flag) + " '" + path + "' could not be written");
}

ReplayOptions replay_options(const ReplayArgs& a) {
  ReplayOptions o;
  o.page_size = a.page_size;
  o.s3fifo_small_fraction = a.small_fraction;
  o.ghost_factor = a.ghost_factor;
  o.sequential = a.sequential;
  o.decode_tokens_per_s = a.rate;
  o.max_batch = a.max_batch;
  o.reuse_hints = a.reuse_hints;
  o.short_output = a.short_output;
  o.tiers = tier_options(a);
  return o;
}

ReplayProgress terminal_progress() {
  std::ostream* out = Progress::terminal();
  if (out == nullptr) return {};
  return [out](std::size_t index, std::size_t runs, const ReplayRun& run) {
    auto bar = std::make_shared<Progress>(
        run.policy + " " + capacity_text(run.capacity_tokens) +
            (runs > 1 ? " (" + std::to_string(index + 1) + "/" + std::to_string(runs) + ")" : ""),
        out);
    return std::function<void(std::size_t, std::size_t)>(
        [bar](std::size_t done, std::size_t total) { (*bar)(done, total); });
  };
}

void run_replay(const ReplayArgs& a) {
  const std::string format = a.json ? "json" : a.format;
  if (format != "table" && format != "json" && format != "csv") {
    throw InvalidArgument("--format must be table, json or csv, got '" + a.format + "'");
  }
  const std::vector<std::uint64_t> capacities = parse_capacity_list(a.capacity);
  const std::vector<std::string> policies = parse_policy_list(a.policy);
  check_runs(policies.size(), capacities.size());
  const ReplayOptions options = replay_options(a);
  const TtftModel model = ttft_model(a);
  const std::vector<TraceRequest> trace = engine::read_mooncake_trace(a.trace);
  const std::vector<ReplayRun> runs =
      run_replays(trace, options, policies, capacities, terminal_progress());
  if (!a.csv.empty()) write_file(a.csv, replay_csv(runs, a.page_size, model), "--csv");
  if (!a.plot.empty()) write_plot(replay_chart(runs, a.trace), a.plot);
  if (format == "csv") {
    std::cout << replay_csv(runs, a.page_size, model);
  } else if (format == "json") {
    nlohmann::json j = nlohmann::json::array();
    for (const ReplayRun& run : runs) j.push_back(to_json(a, run));
    std::cout << (runs.size() == 1 ? j[0] : j).dump(2) << '\n';
  } else {
    print_heading(a, trace.size());
    if (runs.size() == 1) {
      print_one(runs[0], model);
    } else {
      print_sweep(runs);
    }
  }
}

}  // namespace

void add_replay_command(CLI::App& app) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay",
      "Replay a Mooncake JSONL trace against the prefix cache and report hit rates, for every "
      "pair of the capacities and policies given");
  cmd->add_option("--trace", args->trace,
                  "JSONL trace (timestamp, input_length, output_length, hash_ids)")
      ->required();
  cmd->add_option("--page-size", args->page_size, "Tokens per page")->capture_default_str();
  cmd->add_option("--capacity", args->capacity,
                  "Cache capacity in tokens, or a comma-separated list of them: 250K,1M,3M,10M "
                  "(K/M/G = 10^3/10^6/10^9, Ki/Mi/Gi = 2^10/2^20/2^30; at most 2^40); 0 or "
                  "'unlimited': room for the whole trace, nothing evicted")
      ->capture_default_str();
  cmd->add_option("--policy", args->policy,
                  "Eviction policy, or a comma-separated list: lru | s3fifo | tiered | interval | "
                  "belady (offline optimum, --sequential only)")
      ->capture_default_str();
  cmd->add_option("--small-fraction", args->small_fraction,
                  "s3fifo: share of the pool for the probation queue, in (0, 1)")
      ->capture_default_str();
  cmd->add_option("--ghost", args->ghost_factor,
                  "s3fifo/tiered/interval: ghost length (x pool size, 0..64)")
      ->capture_default_str();
  cmd->add_flag(
      "--sequential", args->sequential,
      "One request at a time (match, compute the rest, release) instead of timed arrivals");
  cmd->add_option("--rate", args->rate, "Timed mode: decode tokens per second per request")
      ->capture_default_str();
  cmd->add_option("--max-batch", args->max_batch, "Timed mode: concurrent requests")
      ->capture_default_str();
  cmd->add_flag(
      "--reuse-hints", args->reuse_hints,
      "Release each request with a reuse hint from its output length, as an engine "
      "could (likely if output_length < --short-output, else unlikely); tiered acts on it");
  cmd->add_option("--short-output", args->short_output,
                  "--reuse-hints: outputs shorter than this many tokens mean likely reuse")
      ->capture_default_str();
  cmd->add_option("--host-capacity", args->host_capacity,
                  "A host-memory tier below the device pool, in tokens (like --capacity, but "
                  "bounded): evicted pages are written back to it and prefix hits loaded from it");
  cmd->add_option("--disk-dir", args->disk_dir,
                  "A disk tier in this directory (created if missing; a later replay with the same "
                  "page size finds its pages again). With --host-capacity the host tier writes "
                  "every page through to it. One (policy, capacity) pair only");
  cmd->add_option("--disk-capacity", args->disk_capacity,
                  "The disk tier's capacity in tokens; 0 or 'unlimited' (the default): as many "
                  "pages as the disk holds (a replay page of 512 tokens takes 8 KiB on disk)");
  cmd->add_option("--admission", args->admission,
                  "Which pages the device pool evicts go down to the first tier: every_page, or "
                  "reused (only pages a later request attached again)")
      ->capture_default_str();
  cmd->add_option("--prefill-tflops", args->prefill_tflops,
                  "TTFT model: prefill rate in TFLOP/s, at 2 x 8.03e9 FLOP a token (Llama-3-8B, "
                  "attention term left out); 400 = an H100 at 40 % of its dense bf16 peak")
      ->capture_default_str();
  cmd->add_option("--host-gbps", args->host_gbps,
                  "TTFT model: host tier load bandwidth in GB/s for 128 KiB of KV a token "
                  "(Llama-3-8B bf16); 25 = PCIe 4.0 x16")
      ->capture_default_str();
  cmd->add_option("--disk-gbps", args->disk_gbps,
                  "TTFT model: disk tier load bandwidth in GB/s (2.2 = one NVMe SSD: a 512-token "
                  "page in 30.5 ms, slower than its 20.6 ms prefill below 3.3 GB/s). A device hit "
                  "costs nothing; loads do not overlap compute")
      ->capture_default_str();
  cmd->add_option("--format", args->format,
                  "Output on stdout: table | json (one object, or an array for several runs) | "
                  "csv (a header and one line a run)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Same as --format json");
  cmd->add_option("--csv", args->csv, "Also write the runs as CSV to this file");
  cmd->add_option("--plot", args->plot,
                  "Also draw block hit rate against capacity, one line per policy: FILE.svg "
                  "(written directly) or FILE.png (needs gnuplot, Debian gnuplot-nox)");
  cmd->callback([args] { run_replay(*args); });
}

}  // namespace kvcache::tools
