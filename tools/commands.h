// tools/commands.h — the `kvcache` subcommands.
//
// Each subcommand lives in its own file and registers itself on the root
// CLI11 app with one `add_*_command` call from main.cpp. A subcommand's
// callback throws kvcache::Error (or CLI::Error) on bad input; main() turns
// those into a message on stderr and exit code 2. To add `bench`, `replay`,
// `generate` ...: write tools/<name>.cpp defining add_<name>_command, declare
// it here and call it from main.cpp.
#pragma once

namespace CLI {
class App;
}  // namespace CLI

namespace kvcache::tools {

// `kvcache plan`: how many sequences / tokens a memory budget holds.
void add_plan_command(CLI::App& app);

// `kvcache tour`: plan for a preset plus a narrated lifecycle walk-through.
void add_tour_command(CLI::App& app);

// `kvcache demo`: a workload through the engine under three cache configurations.
void add_demo_command(CLI::App& app);

// `kvcache bench attention|store|tiers`: kernels against memory bandwidth / FMA
// peak; the storage tiers against memcpy and a sequential O_DIRECT read.
void add_bench_command(CLI::App& app);
// `kvcache generate`: one request through the engine, printing the generated ids.
void add_generate_command(CLI::App& app);
// `kvcache replay`: replay a Mooncake JSONL trace against the prefix cache.
void add_replay_command(CLI::App& app);
// `kvcache trace-gen`: a synthetic multi-turn conversation trace for replay.
void add_trace_gen_command(CLI::App& app);

// `kvcache bench-manager`: bookkeeping cost of the paged manager.
void add_bench_manager_command(CLI::App& app);

}  // namespace kvcache::tools
