#include "sim/report.h"

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "sim/builtin.h"
#include "sim/plot.h"

namespace sluice::sim {
namespace {

using ::testing::HasSubstr;

Result Simulated(std::string_view name, uint64_t seed) {
  absl::StatusOr<Scenario> s = LoadBuiltin(name);
  EXPECT_TRUE(s.ok());
  absl::StatusOr<Result> r = Simulate(*s, seed);
  EXPECT_TRUE(r.ok()) << r.status();
  return *std::move(r);
}

TEST(SimReport, SameSeedGivesByteIdenticalOutput) {
  for (const BuiltinScenario& b : BuiltinScenarios()) {
    const Result a = Simulated(b.name, 3);
    const Result again = Simulated(b.name, 3);
    EXPECT_EQ(FormatText(a), FormatText(again)) << b.name;
    EXPECT_EQ(FormatCsv(a), FormatCsv(again)) << b.name;
    EXPECT_EQ(FormatJson(a), FormatJson(again)) << b.name;
    EXPECT_EQ(PlotSvg(a), PlotSvg(again)) << b.name;
  }
  // A random scenario with another seed gives other traffic.
  EXPECT_NE(FormatJson(Simulated("fleet", 3)), FormatJson(Simulated("fleet", 4)));
}

TEST(SimReport, TextHasOneColumnPerLimiterAndTheContract) {
  const std::string text = FormatText(Simulated("boundary-burst", 1));
  EXPECT_THAT(text, HasSubstr("fixed_window 40/min"));
  EXPECT_THAT(text, HasSubstr("80 per 40/min"));
  EXPECT_THAT(text, HasSubstr("2.00x"));
  EXPECT_THAT(text, HasSubstr("8 per 4/h"));
  // The table fits in 120 columns (the first line is the description).
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_LE(lines[i].size(), 120u) << lines[i];
}

TEST(SimReport, CsvHasAHeaderAndARowPerLimiter) {
  const Result r = Simulated("login-storm", 1);
  const std::string csv = FormatCsv(r);
  const std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), r.runs.size() + 1);
  EXPECT_THAT(lines[0], HasSubstr("scenario,seed,limiter,limits,requests,offered"));
  EXPECT_THAT(
      lines[1],
      HasSubstr("login-storm,1,fixed_window 40/min,fixed_window 40/min,400,2200,1800,400,1800"));
  const size_t columns = std::count(lines[0].begin(), lines[0].end(), ',');
  for (const std::string& line : lines)
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), columns) << line;
}

TEST(SimReport, JsonCarriesMetricsAndSeries) {
  const Result r = Simulated("login-storm", 1);
  const nlohmann::json j = nlohmann::json::parse(FormatJson(r));
  EXPECT_EQ(j["scenario"], "login-storm");
  ASSERT_EQ(j["runs"].size(), r.runs.size());
  const nlohmann::json& fixed = j["runs"][0];
  EXPECT_EQ(fixed["metrics"]["admitted"], 400);
  EXPECT_EQ(fixed["metrics"]["peak_retries_1s"], 360);
  EXPECT_EQ(fixed["metrics"]["contract"], "40/min");
  EXPECT_EQ(fixed["series"]["bucket_ms"], 1000.0);
  EXPECT_EQ(fixed["series"]["offered"][60], 360);
}

TEST(SimPlot, OnePanelPerLimiterWithDirectLabels) {
  const Result r = Simulated("login-storm", 1);
  const std::string svg = PlotSvg(r);
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("</svg>"));
  size_t polylines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1))
    ++polylines;
  EXPECT_EQ(polylines, 3 * r.runs.size());  // offered, rejected, admitted per panel
  EXPECT_THAT(svg, HasSubstr(">offered (peak 400)</text>"));
  EXPECT_THAT(svg, HasSubstr(">rejected (peak 360)</text>"));
  EXPECT_THAT(svg, HasSubstr(">capacity</text>"));
  EXPECT_THAT(svg, HasSubstr("fixed_window 40/min"));
}

}  // namespace
}  // namespace sluice::sim
