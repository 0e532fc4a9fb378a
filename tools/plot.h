// tools/plot.h — a line chart written as SVG, with nothing but the standard
// library (`kvcache replay --plot FILE.svg`), and the same chart as PNG
// through gnuplot when it is installed (`--plot FILE.png`).
//
// The chart: a logarithmic x axis (ticks at powers of ten, labelled 1K, 1M
// ...), a linear y axis from 0 to 1 (rates; ticks every 0.2), one <polyline>
// per series with a circle on every point, a legend with each series'
// colour and name, the axis titles and a title. Points with x <= 0 stand for
// "unlimited": they are drawn one step right of the largest finite x, under
// a tick labelled "unlimited". Text is XML-escaped, so the file parses as
// XML whatever the names hold. Pure functions, except write_plot (a file,
// and gnuplot for .png), which throws kvcache::InvalidArgument naming the
// path: an extension other than .svg or .png, a file that cannot be
// written, or .png without gnuplot on PATH (Debian: gnuplot-nox).
#pragma once

#include <string>
#include <vector>

namespace kvcache::tools {

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;  // same length; x <= 0: unlimited
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<PlotSeries> series;
};

// The chart as a standalone SVG document.
std::string line_chart_svg(const LineChart& chart);

// 1000 -> "1K", 250000 -> "250K", 3e6 -> "3M", 1.5e9 -> "1.5G", 512 -> "512".
std::string short_count(double v);

// Writes the chart to `path`: SVG for .svg, PNG (gnuplot) for .png.
void write_plot(const LineChart& chart, const std::string& path);

}  // namespace kvcache::tools
