// tools/main.cpp — the `kvcache` command line.
//
// Registers every subcommand (see commands.h) and maps failures to exit
// codes: 0 success, 2 bad input (CLI11 parse errors and kvcache::Error,
// message on stderr naming the value), 1 anything unexpected.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "commands.h"
#include "kvcache/error.h"
#include "kvcache/version.h"

namespace {

constexpr int kBadInput = 2;

// Debian's OpenBLAS 0.3.21 does not recognise recent Xeons (e.g. Sapphire
// Rapids) and falls back to its SSE3 "Prescott" kernels, several times slower
// for the engine's matrix products. The core type is read once when the
// library loads, so when the user has not chosen one we pick it from the CPU
// flags and re-execute ourselves once (OPENBLAS_CORETYPE also guards the loop).
void choose_blas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* core = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                     : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                       : nullptr;
  if (core == nullptr || setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
}

int run(int argc, char** argv) {
  CLI::App app{"kvcache — KV-cache planning, demos and tools for LLM inference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("kvcache ") + kvcache::version());
  kvcache::tools::add_plan_command(app);
  kvcache::tools::add_demo_command(app);
  kvcache::tools::add_bench_command(app);
  kvcache::tools::add_tour_command(app);
  kvcache::tools::add_generate_command(app);
  kvcache::tools::add_replay_command(app);
  kvcache::tools::add_trace_gen_command(app);
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
  choose_blas_core(argv);
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
