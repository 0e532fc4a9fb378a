#include "kvcache/kernels/isa.h"

#include <cstdint>
#include <mutex>

#include "hwy/targets.h"
#include "kvcache/error.h"

namespace kvcache {

namespace {

// Highway's dispatcher keeps one restriction mask; select_isa() is the only
// writer here. The full list is taken once, before any restriction, so that
// the queries never touch the mask.
struct IsaChoice {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();  // best first
  std::mutex mutex;
  std::int64_t selected = 0;  // 0: the best (no restriction)
};

IsaChoice& isa_choice() {
  static IsaChoice choice;
  return choice;
}

}  // namespace

std::vector<std::string> available_isas() {
  std::vector<std::string> names;
  for (const std::int64_t t : isa_choice().targets) names.emplace_back(hwy::TargetName(t));
  return names;
}

std::string active_isa() {
  IsaChoice& c = isa_choice();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return hwy::TargetName(c.selected != 0 ? c.selected : c.targets.front());
}

void select_isa(std::string_view name) {
  IsaChoice& c = isa_choice();
  const std::lock_guard<std::mutex> lock(c.mutex);
  std::int64_t chosen = name == "auto" ? 0 : -1;
  for (const std::int64_t t : c.targets) {
    if (name == hwy::TargetName(t)) chosen = t;
  }
  if (chosen < 0) {
    std::string choices = "auto";
    for (const std::int64_t t : c.targets) choices += std::string(", ") + hwy::TargetName(t);
    throw InvalidArgument("select_isa: instruction set '" + std::string(name) +
                          "' is not one this build and processor offer (" + choices + ")");
  }
  hwy::SetSupportedTargetsForTest(chosen);
  c.selected = chosen;
}

}  // namespace kvcache
