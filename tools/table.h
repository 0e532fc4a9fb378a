// tools/table.h — small text helpers for the command line's output.
//
// `Table` collects rows of strings and prints them with aligned columns
// (first column left-aligned, the others right-aligned). `format_bytes` and
// `with_commas` render sizes and counts. Header-only, no global state.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace kvcache::tools {

// 1234567 -> "1,234,567".
inline std::string with_commas(std::uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// 17179869184 -> "16.00 GiB"; below 1 KiB -> "512 B".
inline std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return std::to_string(bytes) + " B";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", value, kUnits[unit]);
  return buf;
}

// Comma-joined list of numbers: "{0, 3, 7}".
template <class Range>
std::string format_list(const Range& values) {
  std::string out = "{";
  for (const auto& v : values) {
    if (out.size() > 1) out += ", ";
    out += std::to_string(v);
  }
  return out + "}";
}

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}

  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  // Prints the header, a rule, then the rows, each line prefixed by `indent`.
  void print(std::ostream& os, const std::string& indent = "  ") const {
    const std::vector<std::size_t> widths = column_widths();
    print_row(os, indent, header_, widths);
    std::size_t total = 0;
    for (std::size_t w : widths) total += w + 2;
    os << indent << std::string(total > 2 ? total - 2 : 0, '-') << '\n';
    for (const auto& row : rows_) print_row(os, indent, row, widths);
  }

 private:
  std::vector<std::size_t> column_widths() const {
    std::vector<std::size_t> widths(header_.size(), 0);
    auto grow = [&](const std::vector<std::string>& row) {
      for (std::size_t i = 0; i < row.size() && i < widths.size(); ++i)
        widths[i] = std::max(widths[i], row[i].size());
    };
    grow(header_);
    for (const auto& row : rows_) grow(row);
    return widths;
  }

  static void print_row(std::ostream& os, const std::string& indent,
                        const std::vector<std::string>& row,
                        const std::vector<std::size_t>& widths) {
    os << indent;
    for (std::size_t i = 0; i < widths.size(); ++i) {
      const std::string cell = i < row.size() ? row[i] : "";
      const std::string pad(widths[i] - std::min(widths[i], cell.size()), ' ');
      os << (i == 0 ? cell + pad : pad + cell) << (i + 1 < widths.size() ? "  " : "");
    }
    os << '\n';
  }

  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace kvcache::tools
