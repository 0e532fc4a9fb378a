#include "reliability/parser_inputs.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "kvcache/engine/safetensors.h"
#include "kvcache/error.h"

namespace kvcache::testing {
namespace {

// A scratch file unique to this process, removed on scope exit.
class ScratchFile {
 public:
  explicit ScratchFile(std::span<const std::uint8_t> content)
      : path_((std::filesystem::temp_directory_path() /
               ("kvcache_parser_input_" + std::to_string(::getpid()))).string()) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(content.data()), static_cast<std::streamsize>(content.size()));
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

}  // namespace

void run_parser_input(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return;
  const ScratchFile file(bytes.subspan(1));
  try {
    if (bytes[0] % 2 == 0) {
      check_tensors(engine::read_safetensors(file.path()));
    } else {
      (void)engine::read_hf_config(file.path());
    }
  } catch (const Error&) {
    // Refused with a typed error: the contract holds.
  } catch (const std::logic_error&) {
    throw;
  } catch (const std::exception& e) {
    throw std::logic_error(std::string("parser threw a non-kvcache exception: ") + e.what());
  }
}

}  // namespace kvcache::testing
