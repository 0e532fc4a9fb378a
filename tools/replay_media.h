// tools/replay_media.h — `kvcache replay`'s report of where the hits came
// from (ReplayResult::media: the device pool and each tier) and of the
// modelled TTFT (TtftModel, kvcache/replay/trace_replay.h): a table and
// JSON. replay.cpp prints them beside the totals.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

#include "kvcache/replay/trace_replay.h"

namespace kvcache::tools {

// The model's constants, one line: "Llama-3-8B ... 400 TFLOP/s ...".
std::string ttft_model_text(const TtftModel& model);

// One row per medium (hit share, block hit rate, pages hit, first request
// served, pages and bytes stored and loaded, write-backs dropped, load
// failures, TTFT saved), then the modelled TTFT without and with the cache.
void print_media(std::ostream& out, const ReplayResult& result, const TtftModel& model);

// {"media": [...], "ttft_model": {...}, "ttft_ms": {...}}: the same figures.
nlohmann::json media_json(const ReplayResult& result, const TtftModel& model);

}  // namespace kvcache::tools
