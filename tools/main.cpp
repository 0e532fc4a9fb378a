// tools/main.cpp — the `kvcache` command line.
//
// Registers every subcommand (see commands.h) and maps failures to exit
// codes: 0 success, 2 bad input (CLI11 parse errors and kvcache::Error,
// message on stderr naming the value), 1 anything unexpected.

#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>

#include "commands.h"
#include "kvcache/error.h"

namespace {

constexpr int kBadInput = 2;

int run(int argc, char** argv) {
  CLI::App app{"kvcache — KV-cache planning, demos and tools for LLM inference"};
  app.require_subcommand(1);
  kvcache::tools::add_plan_command(app);
  kvcache::tools::add_demo_command(app);
  kvcache::tools::add_replay_command(app);
  kvcache::tools::add_bench_manager_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message and a usage hint to stderr
    return kBadInput;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kvcache::Error& e) {
    std::cerr << "kvcache: error: " << e.what() << '\n';
    return kBadInput;
  } catch (const std::exception& e) {
    std::cerr << "kvcache: internal error: " << e.what() << '\n';
    return 1;
  }
}
