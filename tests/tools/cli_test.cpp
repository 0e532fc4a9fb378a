// The command line's own functions (tools/): every option described in
// --help, one preset namespace, the progress bar, replay's lists, CSV and
// SVG chart.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "kvcache/engine/trace_file.h"
#include "kvcache/error.h"
#include "plot.h"
#include "presets.h"
#include "progress.h"
#include "replay.h"
#include "test_util.h"

namespace kvcache::tools {
namespace {

void add_all_commands(CLI::App& app) {
  add_plan_command(app);
  add_demo_command(app);
  add_bench_command(app);
  add_tour_command(app);
  add_generate_command(app);
  add_replay_command(app);
  add_trace_gen_command(app);
  add_bench_manager_command(app);
}

// Every option of `app` and its subcommands, "path --option", whose
// description is empty; `visited` counts the subcommands whose help ran.
void undescribed(const CLI::App& app, const std::string& path, std::vector<std::string>& out,
                 int& visited) {
  (void)app.help();  // what `<path> --help` prints
  ++visited;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_description().empty()) out.push_back(path + " " + opt->get_name());
  }
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    undescribed(*sub, path + " " + sub->get_name(), out, visited);
}

TEST(CliHelp, EveryOptionOfEverySubcommandHasADescription) {
  CLI::App app{"kvcache"};
  add_all_commands(app);
  std::vector<std::string> missing;
  int visited = 0;
  undescribed(app, "kvcache", missing, visited);
  EXPECT_GE(visited, 10);  // the root, 7 commands, bench attention and bench store
  EXPECT_TRUE(missing.empty()) << "options without a description: "
                               << ::testing::PrintToString(missing);
}

TEST(CliPresets, OneNamespaceForEveryCommand) {
  for (const char* name : {"tiny", "small", "base", "llama-3-8b", "mistral-7b", "gemma-2-9b"})
    EXPECT_EQ(find_preset(name).name, name);
  KV_EXPECT_THROW(find_preset("llama-9"), InvalidArgument, "llama-9", "tiny", "llama-3-8b");
  // An engine model runs as is.
  const engine::ModelConfig small = engine_model_config(find_preset("small"));
  EXPECT_EQ(small.num_layers, engine::model_preset("small").num_layers);
  EXPECT_TRUE(stand_in_note(find_preset("small")).empty());
  // A published model runs as a stand-in with its attention geometry.
  const ModelPreset& llama = find_preset("llama-3-8b");
  const engine::ModelConfig c = engine_model_config(llama);
  EXPECT_EQ(c.name, "llama-3-8b");
  EXPECT_EQ(c.num_layers, kStandInLayers);
  EXPECT_EQ(c.n_q_heads, 32u);
  EXPECT_EQ(c.n_kv_heads, 8u);
  EXPECT_EQ(c.head_dim, 128u);
  EXPECT_NE(stand_in_note(llama).find("2 of its 32 layers"), std::string::npos);
}

TEST(CliProgress, RedrawsOnlyWhenTheLineChangesAndShowsAnEta) {
  double now = 0;
  std::ostringstream out;
  Progress bar("demo", &out, [&] { return now; });
  bar(0, 100);
  bar(0, 100);  // nothing changed
  EXPECT_EQ(bar.redraws(), 1u);
  now = 10;
  bar(50, 100);  // 10 s for 50: 10 s left
  EXPECT_EQ(bar.redraws(), 2u);
  EXPECT_NE(out.str().find("50/100  ETA 0:10"), std::string::npos) << out.str();
  bar(50, 100);
  EXPECT_EQ(bar.redraws(), 2u);
  EXPECT_EQ(Progress::clock_text(3725), "1:02:05");
  Progress silent("x", nullptr);
  silent(1, 2);
  EXPECT_EQ(silent.redraws(), 0u);
}

TEST(CliReplay, ParsesListsOfCapacitiesAndPolicies) {
  EXPECT_EQ(parse_capacity_list("250K,1M,3M,10M"),
            (std::vector<std::uint64_t>{250000, 1000000, 3000000, 10000000}));
  EXPECT_EQ(parse_capacity_list("0"), (std::vector<std::uint64_t>{0}));
  EXPECT_EQ(parse_capacity_list("unlimited,4Ki"), (std::vector<std::uint64_t>{0, 4096}));
  EXPECT_EQ(parse_policy_list("lru,tiered"), (std::vector<std::string>{"lru", "tiered"}));
  KV_EXPECT_THROW(parse_capacity_list("1M,,3M"), InvalidArgument, "'1M,,3M'", "empty field 2");
  KV_EXPECT_THROW(parse_capacity_list("1M,"), InvalidArgument, "empty field 2");
  KV_EXPECT_THROW(parse_capacity_list("1M,2parsecs"), InvalidArgument, "'2parsecs'");
  KV_EXPECT_THROW(parse_policy_list("lru,fifo9"), InvalidArgument, "fifo9");
  std::string many = "1";
  for (int i = 2; i <= 257; ++i) {
    many += ',';
    many += std::to_string(i);
  }
  KV_EXPECT_THROW(parse_capacity_list(many), InvalidArgument, "257", "256");
}

std::vector<ReplayRun> sweep_small_trace() {
  const auto trace =
      engine::read_mooncake_trace(std::string(KVCACHE_TEST_DATA_DIR) + "/prefix_sweep_trace.jsonl");
  ReplayOptions o;
  o.sequential = true;
  return run_replays(trace, o, {"lru", "tiered"}, {1024, 2048, 0});
}

TEST(CliReplay, EveryPairRunsAndTheCsvHoldsOneLineEach) {
  const std::vector<ReplayRun> runs = sweep_small_trace();
  ASSERT_EQ(runs.size(), 6u);
  EXPECT_EQ(runs[0].policy, "lru");
  EXPECT_EQ(runs[0].capacity_tokens, 1024u);
  EXPECT_EQ(runs[5].policy, "tiered");
  EXPECT_EQ(runs[5].capacity_tokens, 0u);
  const std::string csv = replay_csv(runs, 512);
  std::istringstream lines(csv);
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line,
            "policy,capacity_tokens,capacity_pages,page_size,requests,rejected,block_hit_rate,"
            "token_hit_rate,blocks_total,blocks_hit,evictions,peak_pages_used,"
            "manager_ns_per_request");
  std::vector<std::string> rows;
  while (std::getline(lines, line)) rows.push_back(line);
  ASSERT_EQ(rows.size(), 6u);
  // Unlimited capacity: 20 blocks asked for, 9 distinct; a prompt found whole
  // still computes its last page, so 10 hit (3 + 3 + 2 + 2).
  EXPECT_EQ(rows[2].rfind("lru,0,26,512,6,0,0.500000,0.500000,20,10,0,4,", 0), 0u) << rows[2];
  EXPECT_EQ(rows[5].rfind("tiered,0,26,512,6,0,0.500000,0.500000,20,10,0,4,", 0), 0u) << rows[5];
  // 2 pages of room: a 4-page prompt does not fit (rejected) and nothing hits.
  EXPECT_EQ(rows[0].rfind("lru,1024,2,512,1,5,0.000000,", 0), 0u) << rows[0];
  // More room never hits less, for either policy.
  for (std::size_t p = 0; p < 2; ++p) {
    EXPECT_LE(runs[3 * p].result.blocks_hit, runs[3 * p + 1].result.blocks_hit);
    EXPECT_LE(runs[3 * p + 1].result.blocks_hit, runs[3 * p + 2].result.blocks_hit);
  }
}

TEST(CliReplay, TheChartHasOnePolylinePerPolicyAndEscapesText) {
  LineChart chart = replay_chart(sweep_small_trace(), "a <b> & 'c'");
  ASSERT_EQ(chart.series.size(), 2u);
  EXPECT_EQ(chart.series[0].name, "lru");
  EXPECT_EQ(chart.series[0].x, (std::vector<double>{1024, 2048, 0}));
  const std::string svg = line_chart_svg(chart);
  const std::regex polyline("<polyline ");
  EXPECT_EQ(
      std::distance(std::sregex_iterator(svg.begin(), svg.end(), polyline), std::sregex_iterator()),
      2);
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; &apos;c&apos;"), std::string::npos);
  EXPECT_EQ(svg.find("<b>"), std::string::npos);
  EXPECT_NE(svg.find(">unlimited<"), std::string::npos);
  EXPECT_NE(svg.find(">1.02K<"), std::string::npos);
  EXPECT_EQ(svg.rfind("</svg>\n"), svg.size() - 7);
}

TEST(CliReplay, PlotRefusesOtherExtensions) {
  KV_EXPECT_THROW(write_plot(LineChart{}, "/tmp/chart.jpg"), InvalidArgument, "chart.jpg",
                  ".svg or .png");
}

TEST(CliReplay, BeladyNeedsSequentialBeforeAnyRun) {
  const auto trace =
      engine::read_mooncake_trace(std::string(KVCACHE_TEST_DATA_DIR) + "/prefix_sweep_trace.jsonl");
  ReplayOptions o;
  o.sequential = false;
  int started = 0;
  KV_EXPECT_THROW(run_replays(trace, o, {"lru", "belady"}, {0},
                              [&](std::size_t, std::size_t, const ReplayRun&) {
                                ++started;
                                return std::function<void(std::size_t, std::size_t)>{};
                              }),
                  InvalidArgument, "belady", "--sequential");
  EXPECT_EQ(started, 0);
}

TEST(CliReplay, TiersAddEachMediumsColumnsToTheCsv) {
  const auto trace =
      engine::read_mooncake_trace(std::string(KVCACHE_TEST_DATA_DIR) + "/tier_replay_trace.jsonl");
  ReplayOptions o;
  o.sequential = true;
  o.tiers.host_capacity_tokens = 1024;  // A B C C A, 2 device pages: C from the device, A the host
  const std::string csv = replay_csv(run_replays(trace, o, {"lru"}, {1024}), 512);
  std::istringstream lines(csv);
  std::string header, row;
  std::getline(lines, header);
  std::getline(lines, row);
  EXPECT_NE(header.find(",manager_ns_per_request,device_hit_share,device_block_hit_rate,"),
            std::string::npos)
      << header;
  EXPECT_NE(header.find(",host_pages_hit,host_pages_stored,host_bytes_stored,host_pages_loaded,"),
            std::string::npos)
      << header;
  const std::string ttft = ",ttft_ms_without_cache,ttft_ms_with_cache";
  EXPECT_EQ(header.rfind(ttft), header.size() - ttft.size());
  EXPECT_NE(row.find(",0.500000,0.100000,1,3,12288,1,4096,"), std::string::npos) << row;  // host
  ReplayOptions disk_options;
  disk_options.tiers.disk_dir = "/tmp/kvcache-no";
  KV_EXPECT_THROW(run_replays(trace, disk_options, {"lru"}, {1024, 2048}), InvalidArgument,
                  "takes one run, not 2");
}

TEST(CliPlot, ShortCounts) {
  EXPECT_EQ(short_count(250000), "250K");
  EXPECT_EQ(short_count(1e6), "1M");
  EXPECT_EQ(short_count(1.5e9), "1.5G");
  EXPECT_EQ(short_count(512), "512");
}

}  // namespace
}  // namespace kvcache::tools
