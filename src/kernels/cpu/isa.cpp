#include "kvcache/kernels/isa.h"

#include <cstdint>
#include <mutex>

#include "hwy/targets.h"
#include "kvcache/error.h"

namespace kvcache {

namespace {

// Highway's dispatcher keeps one restriction mask; this remembers what it is
// set to so that the full list can still be named while it is in force.
struct IsaChoice {
  std::mutex mutex;
  std::int64_t selected = 0;  // 0: the best (no restriction)
};

IsaChoice& isa_choice() {
  static IsaChoice choice;
  return choice;
}

// Compiled-in targets this CPU supports, best first, whatever the restriction.
std::vector<std::int64_t> all_targets(std::int64_t selected) {
  if (selected != 0) hwy::SetSupportedTargetsForTest(0);
  std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();
  if (selected != 0) hwy::SetSupportedTargetsForTest(selected);
  return targets;
}

}  // namespace

std::vector<std::string> available_isas() {
  IsaChoice& c = isa_choice();
  const std::lock_guard<std::mutex> lock(c.mutex);
  std::vector<std::string> names;
  for (const std::int64_t t : all_targets(c.selected)) names.emplace_back(hwy::TargetName(t));
  return names;
}

std::string active_isa() {
  IsaChoice& c = isa_choice();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return hwy::TargetName(c.selected != 0 ? c.selected : all_targets(0).front());
}

void select_isa(std::string_view name) {
  IsaChoice& c = isa_choice();
  const std::lock_guard<std::mutex> lock(c.mutex);
  const std::vector<std::int64_t> targets = all_targets(c.selected);
  std::int64_t chosen = -1;
  std::string choices = "auto";
  for (const std::int64_t t : targets) {
    choices += std::string(", ") + hwy::TargetName(t);
    if (name == hwy::TargetName(t)) chosen = t;
  }
  if (name == "auto") chosen = 0;
  if (chosen < 0) {
    throw InvalidArgument("select_isa: instruction set '" + std::string(name) +
                          "' is not one this build and processor offer (" + choices + ")");
  }
  hwy::SetSupportedTargetsForTest(chosen);
  c.selected = chosen;
}

}  // namespace kvcache
