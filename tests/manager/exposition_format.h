// A checker of the Prometheus text exposition format (0.0.4) as kvcache
// writes it, and a reader of its samples, for the metrics tests.
#pragma once

#include <cstdint>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace kvtest {

// Every problem found in `text`, one a line; empty when the text is valid:
// each line ends in '\n' and is "# HELP name text", "# TYPE name
// gauge|counter" or a sample "name{label="value",...} value"; HELP and TYPE
// come once per metric, before its samples, and every sample's metric has
// both; names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
// [a-zA-Z_][a-zA-Z0-9_]*; counters end in _total and gauges do not; values
// are non-negative integers.
inline std::string exposition_problems(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) [^\n\\]+)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*\})? ([0-9]+))");
  std::ostringstream problems;
  if (text.empty() || text.back() != '\n') problems << "the text does not end in a newline\n";
  std::set<std::string> helped, typed, sampled;
  std::map<std::string, std::string> types;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::smatch m;
    const std::string at = "line " + std::to_string(n) + " '" + line + "': ";
    if (std::regex_match(line, m, help)) {
      if (!helped.insert(m[1]).second || sampled.count(m[1]))
        problems << at << "HELP again or late\n";
    } else if (std::regex_match(line, m, type)) {
      if (!typed.insert(m[1]).second || sampled.count(m[1]))
        problems << at << "TYPE again or late\n";
      types[m[1]] = m[2];
      const bool total = m[1].str().size() > 6 && m[1].str().ends_with("_total");
      if ((m[2] == "counter") != total) problems << at << "counters end in _total, gauges do not\n";
    } else if (std::regex_match(line, m, sample)) {
      if (!helped.count(m[1]) || !typed.count(m[1])) problems << at << "sample before HELP/TYPE\n";
      sampled.insert(m[1]);
    } else {
      problems << at << "not HELP, TYPE or a sample\n";
    }
  }
  for (const auto& name : helped)
    if (!sampled.count(name)) problems << name << ": HELP without a sample\n";
  return problems.str();
}

// Sample values by "name{labels}" (the line up to its value).
inline std::map<std::string, std::uint64_t> exposition_samples(const std::string& text) {
  std::map<std::string, std::uint64_t> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    out[line.substr(0, space)] = std::stoull(line.substr(space + 1));
  }
  return out;
}

}  // namespace kvtest
