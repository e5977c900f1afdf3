// Hand-written SVG: a few hundred lines of path data and text, which no
// plotting library in Debian's C++ packages produces without pulling in a
// graphics stack.
#include "sim/plot.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "base/cat.h"

namespace sluice::sim {
namespace {

using internal::Cat;

constexpr double kWidth = 900;
constexpr double kLeft = 60;    // y tick labels
constexpr double kRight = 138;  // direct labels
constexpr double kTop = 58;     // title
constexpr double kPanel = 112;  // panel height
constexpr double kGap = 42;     // panel title above each panel
constexpr double kBottom = 34;  // x tick labels

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string Escape(std::string_view s) {
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
      default:
        out.push_back(c);
    }
  }
  return out;
}

// 1, 2, 5, 10, 20, 50, ...: the smallest such number >= v.
int64_t NiceCeil(double v) {
  int64_t step = 1;
  while (true) {
    for (int64_t m : {1, 2, 5}) {
      if (static_cast<double>(m * step) >= v) return m * step;
    }
    step *= 10;
  }
}

// A readable tick spacing for a time axis of `total` seconds.
int64_t TimeTick(int64_t total) {
  static constexpr int64_t kTicks[] = {1,   2,   5,    10,   15,   30,    60,    120,   300,
                                       600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400};
  for (int64_t t : kTicks) {
    if (total / t <= 12) return t;
  }
  return 86400;
}

std::string TimeLabel(int64_t seconds) {
  if (seconds == 0) return "0";
  if (seconds % 3600 == 0) return Cat(seconds / 3600, "h");
  if (seconds % 60 == 0) return Cat(seconds / 60, "m");
  if (seconds >= 60) return Cat(seconds / 60, "m", seconds % 60, "s");
  return Cat(seconds, "s");
}

// "2.00": the most admitted in any period over the contract's limit.
std::string Ratio2(const LimiterRun& run) {
  const double ratio = run.contract.limit > 0 ? static_cast<double>(run.max_admitted_period) /
                                                    static_cast<double>(run.contract.limit)
                                              : 0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", ratio);
  return buf;
}

// At most kMaxBuckets points per line: a plot of many short buckets is
// noise (Poisson traffic per second); sums over a few seconds show the shape.
constexpr int64_t kMaxBuckets = 150;

int64_t PlotFactor(size_t buckets) {
  static constexpr int64_t kSteps[] = {1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600};
  for (int64_t step : kSteps) {
    if (static_cast<int64_t>(buckets) <= kMaxBuckets * step) return step;
  }
  return 3600;
}

std::vector<int64_t> Sum(const std::vector<int64_t>& v, int64_t factor) {
  std::vector<int64_t> out(
      (v.size() + static_cast<size_t>(factor) - 1) / static_cast<size_t>(factor), 0);
  for (size_t i = 0; i < v.size(); ++i) out[i / static_cast<size_t>(factor)] += v[i];
  return out;
}

struct Line {
  std::vector<int64_t> values;
  std::string_view name;
  std::string_view colour;
  double width;
};

}  // namespace

std::string PlotSvg(const Result& result) {
  const size_t panels = result.runs.size();
  const double height = kTop + static_cast<double>(panels) * (kGap + kPanel) + kBottom;
  const double plot_w = kWidth - kLeft - kRight;
  const int64_t factor = result.runs.empty() ? 1 : PlotFactor(result.runs[0].series.offered.size());
  const int64_t bucket_s =
      factor * (result.runs.empty()
                    ? 1
                    : std::max<int64_t>(1, result.runs[0].series.bucket.micros() / 1'000'000));
  const int64_t total_s = (result.duration.micros() + 999'999) / 1'000'000;
  auto x_of = [&](double seconds) {
    return kLeft + plot_w * seconds / static_cast<double>(total_s);
  };

  std::string svg = Cat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", Num(kWidth),
                        "\" height=\"", Num(height), "\" viewBox=\"0 0 ", Num(kWidth), " ",
                        Num(height), "\" font-family=\"sans-serif\" font-size=\"12\">\n",
                        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n", "<text x=\"",
                        Num(kLeft), "\" y=\"22\" font-size=\"15\" font-weight=\"bold\">sluice sim ",
                        Escape(result.scenario), "</text>\n", "<text x=\"", Num(kLeft),
                        "\" y=\"40\" fill=\"#444\">", Escape(result.description), "</text>\n");
  const std::string per = bucket_s == 1 ? "per second" : Cat("per ", TimeLabel(bucket_s));
  svg +=
      Cat("<text x=\"", Num(kWidth - 8), "\" y=\"22\" text-anchor=\"end\" fill=\"#666\">requests ",
          per, ", seed ", result.seed, "</text>\n");

  const int64_t tick = TimeTick(total_s);
  for (size_t p = 0; p < panels; ++p) {
    const LimiterRun& run = result.runs[p];
    const double top = kTop + static_cast<double>(p) * (kGap + kPanel) + kGap;
    const double bottom = top + kPanel;
    const Line lines[] = {{Sum(run.series.offered, factor), "offered", "#8c8c8c", 1.5},
                          {Sum(run.series.rejected, factor), "rejected", "#d62728", 1.5},
                          {Sum(run.series.admitted, factor), "admitted", "#1f6fb4", 2.0}};
    double capacity = -1;  // downstream capacity per bucket
    if (result.downstream) {
      capacity = static_cast<double>(result.downstream->capacity.limit) *
                 static_cast<double>(bucket_s) * 1e6 /
                 static_cast<double>(result.downstream->capacity.period.micros());
    }
    int64_t peak = 1;
    for (const Line& l : lines) {
      for (int64_t v : l.values) peak = std::max(peak, v);
    }
    const int64_t y_max = NiceCeil(std::max(static_cast<double>(peak), capacity));
    auto y_of = [&](double v) { return bottom - kPanel * v / static_cast<double>(y_max); };

    // Panel title: the name, then the numbers a reader compares.
    svg +=
        Cat("<text x=\"", Num(kLeft), "\" y=\"", Num(top - 10), "\"><tspan font-weight=\"bold\">",
            Escape(run.name), "</tspan><tspan dx=\"10\" fill=\"#444\">admitted ", run.admitted,
            ", rejected ", run.rejected, ", most in any ", FormatDuration(run.contract.period),
            ": ", run.max_admitted_period, " (", Ratio2(run), "x ", FormatRate(run.contract), ")");
    if (run.served_by)
      svg += Cat(", served by ", TimeLabel((run.served_by->micros() + 999'999) / 1'000'000));
    svg += "</tspan></text>\n";
    // Frame, grid and y ticks.
    svg += Cat("<rect x=\"", Num(kLeft), "\" y=\"", Num(top), "\" width=\"", Num(plot_w),
               "\" height=\"", Num(kPanel), "\" fill=\"#fafafa\" stroke=\"#ccc\"/>\n");
    for (int64_t t = tick; t < total_s; t += tick) {
      svg += Cat("<line x1=\"", Num(x_of(static_cast<double>(t))), "\" y1=\"", Num(top), "\" x2=\"",
                 Num(x_of(static_cast<double>(t))), "\" y2=\"", Num(bottom),
                 "\" stroke=\"#e4e4e4\"/>\n");
    }
    for (int64_t v : {int64_t{0}, y_max / 2, y_max}) {
      if (v == y_max / 2 && y_max % 2 != 0) continue;
      svg += Cat("<text x=\"", Num(kLeft - 6), "\" y=\"", Num(y_of(static_cast<double>(v)) + 4),
                 "\" text-anchor=\"end\" fill=\"#666\">", v, "</text>\n");
    }
    // Downstream capacity, dashed.
    struct Label {
      double y;
      std::string text;
      std::string_view colour;
    };
    std::vector<Label> labels;
    if (capacity >= 0) {
      svg += Cat("<line x1=\"", Num(kLeft), "\" y1=\"", Num(y_of(capacity)), "\" x2=\"",
                 Num(kLeft + plot_w), "\" y2=\"", Num(y_of(capacity)),
                 "\" stroke=\"#2ca02c\" stroke-dasharray=\"5,4\"/>\n");
      labels.push_back({y_of(capacity), "capacity", "#2ca02c"});
    }
    // The series as step lines, equal neighbours merged.
    for (const Line& l : lines) {
      const std::vector<int64_t>& v = l.values;
      std::string points;
      int64_t max_value = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        max_value = std::max(max_value, v[i]);
        if (i > 0 && v[i] == v[i - 1] && i + 1 < v.size()) continue;
        const double x0 = x_of(static_cast<double>(i) * static_cast<double>(bucket_s));
        const double y = y_of(static_cast<double>(v[i]));
        if (i > 0) points += Cat(Num(x0), ",", Num(y_of(static_cast<double>(v[i - 1]))), " ");
        points += Cat(Num(x0), ",", Num(y), " ");
        if (i + 1 == v.size()) {
          points += Cat(Num(x_of(std::min<double>(static_cast<double>(total_s),
                                                  static_cast<double>((i + 1) * bucket_s)))),
                        ",", Num(y));
        }
      }
      svg += Cat("<polyline fill=\"none\" stroke=\"", l.colour, "\" stroke-width=\"", Num(l.width),
                 "\" points=\"", points, "\"/>\n");
      labels.push_back(
          {y_of(static_cast<double>(max_value)), Cat(l.name, " (peak ", max_value, ")"), l.colour});
    }
    // Direct labels in the right margin, level with each line's peak,
    // nudged apart so none overlap.
    std::stable_sort(labels.begin(), labels.end(),
                     [](const Label& a, const Label& b) { return a.y < b.y; });
    constexpr double kSpacing = 13;
    for (size_t i = 0; i < labels.size(); ++i) {
      labels[i].y = std::max(labels[i].y, top + 8);
      if (i > 0) labels[i].y = std::max(labels[i].y, labels[i - 1].y + kSpacing);
    }
    for (size_t i = labels.size(); i-- > 0;) {  // push back up from the bottom edge
      labels[i].y =
          std::min(labels[i].y, bottom + 2 - kSpacing * static_cast<double>(labels.size() - 1 - i));
      if (i + 1 < labels.size()) labels[i].y = std::min(labels[i].y, labels[i + 1].y - kSpacing);
    }
    for (const Label& l : labels) {
      svg += Cat("<text x=\"", Num(kLeft + plot_w + 6), "\" y=\"", Num(l.y + 4), "\" fill=\"",
                 l.colour, "\" font-size=\"11\">", Escape(l.text), "</text>\n");
    }
  }
  // The shared time axis, under the last panel.
  const double axis_y = kTop + static_cast<double>(panels) * (kGap + kPanel);
  for (int64_t t = 0; t <= total_s; t += tick) {
    svg += Cat("<text x=\"", Num(x_of(static_cast<double>(t))), "\" y=\"", Num(axis_y + 16),
               "\" text-anchor=\"middle\" fill=\"#666\">", TimeLabel(t), "</text>\n");
  }
  svg += Cat("<text x=\"", Num(kLeft + plot_w), "\" y=\"", Num(axis_y + 30),
             "\" text-anchor=\"end\" fill=\"#666\">time since the start</text>\n");
  svg += "</svg>\n";
  return svg;
}

}  // namespace sluice::sim
