// tools/bench_report.cpp — `kvcache bench`'s human output: the figures of a
// bench result as aligned tables (tools/table.h), like `plan` and `demo`.
// Reads only the JSON object the benchmark returned (bench.h), so the
// table and --json always show the same run; a figure the run did not
// produce is left out.
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "table.h"

namespace kvcache::tools {
namespace {

using nlohmann::json;

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string seconds(double s) {
  if (s >= 1.0) return fmt("%.3f s", s);
  if (s >= 1e-3) return fmt("%.3f ms", s * 1e3);
  return fmt("%.2f us", s * 1e6);
}

std::string gbps(const json& v) { return fmt("%.1f GB/s", v.get<double>()); }

// "0.93 (0.90 .. 0.95)" from key, key_min and key_max.
std::string ratio(const json& j, const std::string& key) {
  std::string out = fmt("%.3f", j[key].get<double>());
  if (j.contains(key + "_min") && j.contains(key + "_max")) {
    out += fmt(" (%.3f", j[key + "_min"].get<double>()) +
           fmt(" .. %.3f)", j[key + "_max"].get<double>());
  }
  return out;
}

std::string check(const json& j, const char* ok_key, const char* detail_key, const char* what) {
  std::string out = j[ok_key].get<bool>() ? "ok" : "FAILED";
  if (j.contains(detail_key)) {
    out += std::string(" (") + what + " " +
           (j[detail_key].is_number_float() ? fmt("%.2g", j[detail_key].get<double>())
                                            : j[detail_key].dump()) +
           ")";
  }
  return out;
}

std::string text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

void title(const json& j, std::ostream& os) {
  const bool attention = j["bench"] == "attention";
  os << "kvcache bench " << text(j["bench"]) << ": " << text(j["dtype"]);
  if (attention) {
    os << ", " << text(j["mode"]) << ", context " << text(j["context"]) << ", "
       << text(j["q_heads"]) << " q / ";
  } else {
    os << ", " << text(j["tokens"]) << " new tokens, ";
  }
  os << text(j["kv_heads"]) << " KV heads, head dim " << text(j["head_dim"]) << ", batch "
     << text(j["batch"]) << "\n  "
     << (j["strategy"] == "both" ? "paged and continuous caches" : text(j["strategy"]) + " cache")
     << " (page " << text(j["page_size"]) << ", " << text(j["page_order"]) << ", "
     << text(j["layout"]) << ", " << text(j["arrangement"]) << "), " << text(j["threads"])
     << " threads, isa " << text(j["isa"]) << ", prefetch " << text(j["prefetch"]);
  if (attention)
    os << ", resident " << text(j["resident"]) << ", precision " << text(j["precision"]);
  os << ", huge pages " << text(j["huge_pages"]) << "\n\n";
}

void attention_rows(const json& j, Table& t) {
  t.add_row(
      {"check against the reference", check(j, "check_ok", "check_max_abs_err", "max error")});
  t.add_row({"time per call (median, min)",
             seconds(j["median_s"].get<double>()) + ", " + seconds(j["min_s"].get<double>())});
  t.add_row({"K+V bytes per call", format_bytes(j["bytes_kv"].get<std::uint64_t>())});
  t.add_row({"working set", format_bytes(j["working_set_bytes"].get<std::uint64_t>()) + " in " +
                                text(j["sets"]) + " set(s)"});
  t.add_row({"calls timed", text(j["repeats"]) + " in " + text(j["rounds"]) + " rounds"});
  t.add_row({"kernel rate", gbps(j["gbps"])});
  if (j.contains("tokens_per_s"))
    t.add_row({"tokens/s (one layer)", fmt("%.0f", j["tokens_per_s"].get<double>())});
  t.add_row({"stream read", gbps(j["stream_gbps"])});
  t.add_row({"fraction of stream", ratio(j, "fraction_of_stream")});
  if (j.contains("paged_read_gbps")) {
    t.add_row({"paged read (no arithmetic)", gbps(j["paged_read_gbps"])});
    t.add_row({"fraction of paged read", fmt("%.3f", j["fraction_of_paged_read"].get<double>())});
  }
  t.add_row({"GFLOP/s (FMA peak)", fmt("%.1f", j["gflops"].get<double>()) +
                                       fmt(" (%.1f)", j["peak_gflops"].get<double>())});
  if (j.contains("roofline_gbps")) {
    t.add_row({"roofline", gbps(j["roofline_gbps"]) + ", " + text(j["roofline_bound"]) + "-bound"});
    t.add_row({"fraction of roofline", fmt("%.3f", j["fraction_of_roofline"].get<double>())});
  }
  if (j.contains("fraction_of_peak")) {
    t.add_row({"fraction of FMA peak", fmt("%.3f", j["fraction_of_peak"].get<double>())});
  }
  if (j.contains("paged_over_continuous")) {
    t.add_row({"continuous: check",
               check(j, "continuous_check_ok", "continuous_check_max_abs_err", "max error")});
    t.add_row({"continuous: time per call", seconds(j["continuous_median_s"].get<double>())});
    t.add_row({"continuous: rate", gbps(j["continuous_gbps"])});
    t.add_row({"paged over continuous", ratio(j, "paged_over_continuous")});
  }
}

void store_rows(const json& j, Table& t) {
  t.add_row({"check against the reference",
             check(j, "check_ok", "check_elements_differ", "elements differing:")});
  t.add_row({"time per call (median)", seconds(j["median_s"].get<double>())});
  t.add_row({"bytes moved per call",
             format_bytes(static_cast<std::uint64_t>(j["bytes_moved"].get<double>()))});
  t.add_row({"calls timed", text(j["repeats"]) + " in " + text(j["rounds"]) + " rounds"});
  t.add_row({"store rate", gbps(j["gbps"])});
  if (j.contains("tokens_per_s"))
    t.add_row({"tokens/s (one layer)", fmt("%.0f", j["tokens_per_s"].get<double>())});
  t.add_row({"copy rate", gbps(j["memcpy_gbps"])});
  t.add_row({"fraction of copy", ratio(j, "fraction_of_memcpy")});
  t.add_row({"RoPE on K", j["rope"].get<bool>()
                              ? (j["rope_table"].get<bool>() ? "fused, RopeTable" : "fused")
                              : "no"});
}

void sweep_table(const json& j, std::ostream& os) {
  os << "\n  prefetch strategies on one cache (over auto: median of per-round ratios)\n";
  Table t({"prefetch", "resolves to", "rate", "over auto", "check"});
  for (const json& row : j["prefetch_sweep"]) {
    t.add_row({text(row["prefetch"]), text(row["resolved"]), gbps(row["gbps"]),
               row.contains("over_auto") ? ratio(row, "over_auto") : "1",
               row["check_ok"].get<bool>() ? "ok" : "FAILED"});
  }
  t.print(os);
  os << "  fastest: " << text(j["best_prefetch"]) << '\n';
}

}  // namespace

void print_bench_table(const json& j, std::ostream& os) {
  title(j, os);
  Table t({"figure", "value"});
  if (j["bench"] == "attention") {
    attention_rows(j, t);
  } else {
    store_rows(j, t);
  }
  t.print(os);
  if (j.contains("prefetch_sweep")) sweep_table(j, os);
}

}  // namespace kvcache::tools
