// tools/plot.cpp — line charts as SVG (and PNG through gnuplot): plot.h.
#include "plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "kvcache/error.h"

namespace kvcache::tools {
namespace {

constexpr double kWidth = 760, kHeight = 460;
constexpr double kLeft = 70, kRight = 190, kTop = 44, kBottom = 64;
constexpr double kPlotW = kWidth - kLeft - kRight, kPlotH = kHeight - kTop - kBottom;
constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#17becf"};
// Distinct x values above which the axis is labelled by decades instead.
constexpr std::size_t kMaxPointTicks = 12;

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters other than tab / newline are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// The log10 x range of the chart, and where "unlimited" (x <= 0) goes.
struct XAxis {
  double lo = 0, hi = 1, unlimited = 1;  // log10
  bool has_unlimited = false;
  std::set<double> finite;  // distinct finite x values (ticks)

  explicit XAxis(const LineChart& chart) {
    for (const PlotSeries& s : chart.series) {
      for (double x : s.x) {
        if (x > 0) {
          finite.insert(x);
        } else {
          has_unlimited = true;
        }
      }
    }
    if (!finite.empty()) {
      lo = std::log10(*finite.begin());
      hi = std::log10(*finite.rbegin());
    }
    const double step = std::max(0.5, (hi - lo) * 0.15);
    unlimited = finite.empty() ? lo : hi + step;
    if (has_unlimited) hi = unlimited;
    if (hi - lo < 1e-9) {
      lo -= 0.5;
      hi += 0.5;
    }
    const double pad = (hi - lo) * 0.04;
    lo -= pad;
    hi += pad;
  }
  double log_of(double x) const { return x > 0 ? std::log10(x) : unlimited; }
  double px(double x) const { return kLeft + (log_of(x) - lo) / (hi - lo) * kPlotW; }
};

double py(double y) { return kTop + (1.0 - std::clamp(y, 0.0, 1.0)) * kPlotH; }

void x_tick(std::ostringstream& o, double px, const std::string& label) {
  o << "<line x1=\"" << num(px) << "\" y1=\"" << num(kTop) << "\" x2=\"" << num(px) << "\" y2=\""
    << num(kTop + kPlotH) << "\" stroke=\"#e0e0e0\"/>\n"
    << "<text x=\"" << num(px) << "\" y=\"" << num(kTop + kPlotH + 18)
    << "\" text-anchor=\"middle\">" << xml_escape(label) << "</text>\n";
}

void axes(std::ostringstream& o, const LineChart& chart, const XAxis& ax) {
  for (int i = 0; i <= 5; ++i) {  // y grid and labels
    const double y = i / 5.0;
    o << "<line x1=\"" << num(kLeft) << "\" y1=\"" << num(py(y)) << "\" x2=\""
      << num(kLeft + kPlotW) << "\" y2=\"" << num(py(y)) << "\" stroke=\"#e0e0e0\"/>\n"
      << "<text x=\"" << num(kLeft - 8) << "\" y=\"" << num(py(y) + 4) << "\" text-anchor=\"end\">"
      << (i == 5 ? "1.0" : "0." + std::to_string(2 * i)) << "</text>\n";
  }
  if (ax.finite.size() <= kMaxPointTicks) {
    for (double x : ax.finite) x_tick(o, ax.px(x), short_count(x));
  } else {
    for (double d = std::ceil(ax.lo); d <= ax.hi; d += 1) {
      x_tick(o, ax.px(std::pow(10, d)), short_count(std::pow(10, d)));
    }
  }
  if (ax.has_unlimited) x_tick(o, ax.px(0), "unlimited");
  o << "<rect x=\"" << num(kLeft) << "\" y=\"" << num(kTop) << "\" width=\"" << num(kPlotW)
    << "\" height=\"" << num(kPlotH) << "\" fill=\"none\" stroke=\"#333333\"/>\n"
    << "<text x=\"" << num(kLeft + kPlotW / 2) << "\" y=\"" << num(kHeight - 18)
    << "\" text-anchor=\"middle\">" << xml_escape(chart.x_label) << " (log scale)</text>\n"
    << "<text transform=\"translate(18," << num(kTop + kPlotH / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">" << xml_escape(chart.y_label) << "</text>\n"
    << "<text x=\"" << num(kLeft + kPlotW / 2) << "\" y=\"24\" text-anchor=\"middle\" "
    << "font-size=\"15\">" << xml_escape(chart.title) << "</text>\n";
}

void series(std::ostringstream& o, const PlotSeries& s, const XAxis& ax, std::size_t index) {
  const char* colour = kColours[index % std::size(kColours)];
  std::vector<std::pair<double, double>> points;
  for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
    points.emplace_back(ax.px(s.x[i]), py(s.y[i]));
  std::sort(points.begin(), points.end());
  o << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\" points=\"";
  for (std::size_t i = 0; i < points.size(); ++i)
    o << (i ? " " : "") << num(points[i].first) << ',' << num(points[i].second);
  o << "\"/>\n";
  for (const auto& [x, y] : points)
    o << "<circle cx=\"" << num(x) << "\" cy=\"" << num(y) << "\" r=\"3.5\" fill=\"" << colour
      << "\"/>\n";
  const double ly = kTop + 10 + 22.0 * static_cast<double>(index);
  const double lx = kLeft + kPlotW + 16;
  o << "<line x1=\"" << num(lx) << "\" y1=\"" << num(ly) << "\" x2=\"" << num(lx + 24) << "\" y2=\""
    << num(ly) << "\" stroke=\"" << colour << "\" stroke-width=\"2\"/>\n"
    << "<text x=\"" << num(lx + 30) << "\" y=\"" << num(ly + 4) << "\">" << xml_escape(s.name)
    << "</text>\n";
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

std::string gnuplot_quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

// The chart through gnuplot's png terminal (data inline, script on stdin).
void write_png(const LineChart& chart, const std::string& path) {
  if (!on_path("gnuplot")) {
    throw InvalidArgument("--plot " + path +
                          ": a .png needs gnuplot on PATH (Debian: apt-get install gnuplot-nox), "
                          "which is not there; write a .svg instead");
  }
  const XAxis ax(chart);
  std::ostringstream s;
  s << "set terminal png size " << kWidth << "," << kHeight << "\nset output "
    << gnuplot_quoted(path) << "\nset title " << gnuplot_quoted(chart.title) << "\nset xlabel "
    << gnuplot_quoted(chart.x_label + " (log scale)") << "\nset ylabel "
    << gnuplot_quoted(chart.y_label) << "\nset logscale x\nset yrange [0:1]\nset grid\n"
    << "set key outside right\nset xrange [" << std::pow(10, ax.lo) << ":" << std::pow(10, ax.hi)
    << "]\n";
  if (ax.has_unlimited) s << "set xtics add (\"unlimited\" " << std::pow(10, ax.unlimited) << ")\n";
  s << "plot ";
  for (std::size_t i = 0; i < chart.series.size(); ++i)
    s << (i ? ", " : "") << "'-' with linespoints lw 2 pt 7 title "
      << gnuplot_quoted(chart.series[i].name);
  s << '\n';
  for (const PlotSeries& p : chart.series) {
    std::vector<std::pair<double, double>> points;
    for (std::size_t i = 0; i < p.x.size() && i < p.y.size(); ++i)
      points.emplace_back(std::pow(10, ax.log_of(p.x[i])), p.y[i]);
    std::sort(points.begin(), points.end());
    for (const auto& [x, y] : points) s << x << ' ' << y << '\n';
    s << "e\n";
  }
  FILE* pipe = popen("gnuplot", "w");
  if (pipe == nullptr) throw InvalidArgument("--plot " + path + ": could not start gnuplot");
  const std::string script = s.str();
  std::fwrite(script.data(), 1, script.size(), pipe);
  const int status = pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw InvalidArgument("--plot " + path + ": gnuplot failed (exit status " +
                          std::to_string(status) + ")");
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string short_count(double v) {
  static constexpr std::pair<double, const char*> kUnits[] = {
      {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "K"}};
  for (const auto& [scale, suffix] : kUnits) {
    if (v >= scale) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3g%s", v / scale, suffix);
      return buf;
    }
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string line_chart_svg(const LineChart& chart) {
  const XAxis ax(chart);
  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" viewBox=\"0 0 " << kWidth << ' ' << kHeight
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  axes(o, chart, ax);
  for (std::size_t i = 0; i < chart.series.size(); ++i) series(o, chart.series[i], ax, i);
  o << "</svg>\n";
  return o.str();
}

void write_plot(const LineChart& chart, const std::string& path) {
  if (ends_with(path, ".png")) return write_png(chart, path);
  if (!ends_with(path, ".svg")) {
    throw InvalidArgument("--plot '" + path + "' must end in .svg or .png");
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << line_chart_svg(chart);
  out.close();
  if (!out) throw InvalidArgument("--plot '" + path + "' could not be written");
}

}  // namespace kvcache::tools
