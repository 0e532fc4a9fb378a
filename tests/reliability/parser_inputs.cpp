#include "reliability/parser_inputs.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/engine/safetensors.h"
#include "kvcache/engine/trace_file.h"
#include "kvcache/error.h"

namespace kvcache::testing {
namespace {

// A scratch file unique to this process, removed on scope exit.
class ScratchFile {
 public:
  explicit ScratchFile(std::span<const std::uint8_t> content)
      : path_((std::filesystem::temp_directory_path() /
               ("kvcache_parser_input_" + std::to_string(::getpid())))
                  .string()) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(content.data()),
              static_cast<std::streamsize>(content.size()));
  }
  ~ScratchFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void check_tensors(const engine::TensorMap& tensors) {
  for (const auto& [name, t] : tensors) {
    std::uint64_t elements = 1;
    for (std::uint64_t d : t.shape) elements *= d;
    if (elements != t.data.size()) {
      throw std::logic_error("tensor " + name + " has " + std::to_string(t.data.size()) +
                             " values for a shape of " + std::to_string(elements));
    }
  }
}

void check_trace(const std::vector<TraceRequest>& trace) {
  for (const TraceRequest& r : trace) {
    if (!(r.timestamp_ms >= 0 && r.timestamp_ms <= engine::kMaxTraceTimestampMs) ||
        r.input_length > kMaxTraceRequestTokens || r.output_length > kMaxTraceRequestTokens ||
        r.hash_ids.size() > kMaxTraceHashIds) {
      throw std::logic_error("a trace request past the limits was accepted");
    }
  }
}

void check_token_count(std::span<const std::uint8_t> text) {
  const std::uint64_t tokens = engine::parse_token_count(
      std::string_view(reinterpret_cast<const char*>(text.data()), text.size()));
  if (tokens > engine::kMaxTokenCount) {
    throw std::logic_error("token count " + std::to_string(tokens) + " past the limit accepted");
  }
}

void run_one(std::uint8_t selector, std::span<const std::uint8_t> content,
             const std::string& path) {
  switch (selector % 4) {
    case 0:
      return check_tensors(engine::read_safetensors(path));
    case 1:
      return (void)engine::read_hf_config(path);
    case 2:
      return check_trace(engine::read_mooncake_trace(path));
    default:
      return check_token_count(content);
  }
}

}  // namespace

void run_parser_input(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return;
  const ScratchFile file(bytes.subspan(1));
  try {
    run_one(bytes[0], bytes.subspan(1), file.path());
  } catch (const Error&) {
    // Refused with a typed error: the contract holds.
  } catch (const std::logic_error&) {
    throw;
  } catch (const std::exception& e) {
    throw std::logic_error(std::string("parser threw a non-kvcache exception: ") + e.what());
  }
}

}  // namespace kvcache::testing
