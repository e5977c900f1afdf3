// sliding_window's two-window estimate against sliding_log (exact), on seeded
// Poisson and bursty traces. Both run on the same trace, each with its own
// state; for each trace we measure
//   overshoot:    max over every half-open interval [t, t + period) of the
//                 cost sliding_window admitted in it, divided by the limit
//                 (sliding_log's is <= 1 by construction);
//   disagreement: the fraction of requests decided differently from
//                 sliding_log;
//   throughput:   cost admitted by sliding_window / by sliding_log.
// The numbers are printed ("[ measured ]" lines) and recorded as test
// properties for docs/algorithms.md; the assertions use bounds chosen from
// these measurements with margin (see kRates below).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "conformance/algorithms.h"
#include "conformance/trace.h"
#include "gtest/gtest.h"

namespace sluice::conformance {
namespace {

struct Accuracy {
  double overshoot = 0;      // sliding_window, max cost in a period / limit
  double log_overshoot = 0;  // sliding_log, the same (<= 1)
  double disagreement = 0;   // fraction of requests decided differently
  double throughput = 0;     // admitted cost, sliding_window / sliding_log
};

// The max over [t, t + period) of the admitted cost, over t at admitted
// requests (where the maximum is reached), for a time-ordered list.
int64_t MaxInAnyPeriod(const std::vector<Request>& admitted, Duration period) {
  int64_t best = 0, sum = 0;
  size_t end = 0;
  for (size_t start = 0; start < admitted.size(); ++start) {
    while (end < admitted.size() && admitted[end].at - admitted[start].at < period) {
      sum += admitted[end++].cost;
    }
    best = std::max(best, sum);
    sum -= admitted[start].cost;
  }
  return best;
}

Accuracy Measure(std::string_view rate_text, const std::vector<Request>& trace) {
  const Rate rate = MustParseRate(rate_text);
  const SlidingWindowConfig window = *SlidingWindowConfig::Create({.rate = rate});
  const SlidingLogConfig log = *SlidingLogConfig::Create({.rate = rate});
  SlidingWindowState window_state;
  SlidingLogState log_state;
  std::vector<Request> window_admitted, log_admitted;
  int64_t differ = 0;
  for (const Request& r : trace) {
    const bool by_window =
        Algo<SlidingWindowConfig>::Step(window, window_state, r.at, r.cost).allowed;
    const bool by_log = Algo<SlidingLogConfig>::Step(log, log_state, r.at, r.cost).allowed;
    if (by_window) window_admitted.push_back(r);
    if (by_log) log_admitted.push_back(r);
    differ += by_window != by_log ? 1 : 0;
  }
  Accuracy a;
  const double n = static_cast<double>(trace.size());
  const double limit = static_cast<double>(rate.limit);
  a.overshoot = static_cast<double>(MaxInAnyPeriod(window_admitted, rate.period)) / limit;
  a.log_overshoot = static_cast<double>(MaxInAnyPeriod(log_admitted, rate.period)) / limit;
  a.disagreement = static_cast<double>(differ) / n;
  a.throughput = static_cast<double>(window_admitted.size()) /
                 static_cast<double>(std::max<size_t>(1, log_admitted.size()));
  return a;
}

void Print(const std::string& what, const Accuracy& a) {
  char line[256];
  std::snprintf(line, sizeof line,
                "[ measured ] %-32s overshoot %.3fx  disagreement %5.2f%%  throughput %.3fx\n",
                what.c_str(), a.overshoot, 100 * a.disagreement, a.throughput);
  std::cout << line;
}

// Bounds, chosen from measurements with margin. The test runs two seeds; the
// bounds were set from twenty (501..520), whose worst cases are quoted.
//
// overshoot (max cost in any period-long interval / limit):
//   Poisson, loads 0.5x..4x: the error is mostly granularity, so it shrinks
//   with the limit. Worst / median of twenty seeds:
//     10/s     1.50x / 1.30x  -> bound 1.70x
//     40/min   1.23x / 1.13x  -> bound 1.35x
//     100/min  1.16x / 1.05x  -> bound 1.30x
//     1000/h   1.04x / 1.00x  -> bound 1.15x
//   Bursty (bursts of 1..2x limit in a tenth of a period): worst 1.90x
//   (10/s), 1.88x (40/min), 1.81x (100/min), 1.66x (1000/h); the bound is
//   the theoretical 2x (a period-long interval meets at most two windows,
//   each holding at most `limit`), which PathologicalTrace approaches.
// disagreement (fraction of requests decided differently; once one decision
// differs the two states diverge, so this counts knock-on effects too):
//   Poisson worst 41.9%, bursty worst 44.9% -> bound 55% for both.
struct RateBounds {
  std::string_view rate;
  double poisson_overshoot;
};
constexpr RateBounds kRates[] = {
    {"10/s", 1.70}, {"40/min", 1.35}, {"100/min", 1.30}, {"1000/h", 1.15}};
constexpr double kMaxBurstyOvershoot = 2.0;
constexpr double kMaxDisagreement = 0.55;
constexpr uint64_t kSlidingWindowAccuracySeeds[] = {501, 502};
constexpr int kSlidingWindowAccuracySteps = 4000;

TEST(SlidingWindowAccuracyTest, PoissonTrafficStaysCloseToSlidingLog) {
  Accuracy worst;
  for (const auto& [rate_text, max_overshoot] : kRates) {
    const Rate rate = MustParseRate(rate_text);
    for (const double load : {0.5, 0.9, 1.0, 1.1, 1.5, 2.0, 4.0}) {
      for (uint64_t seed : kSlidingWindowAccuracySeeds) {
        const Accuracy a =
            Measure(rate_text, PoissonTrace(seed, rate, load, kSlidingWindowAccuracySteps));
        Print("poisson " + std::string(rate_text) + " load " + std::to_string(load).substr(0, 3) +
                  " seed " + std::to_string(seed),
              a);
        EXPECT_LE(a.log_overshoot, 1.0);  // the exact log, as a sanity check
        EXPECT_LE(a.overshoot, max_overshoot) << rate_text << " load " << load;
        EXPECT_LE(a.disagreement, kMaxDisagreement) << rate_text << " load " << load;
        worst.overshoot = std::max(worst.overshoot, a.overshoot);
        worst.disagreement = std::max(worst.disagreement, a.disagreement);
        worst.throughput = std::max(worst.throughput, a.throughput);
      }
    }
  }
  Print("poisson worst case", worst);
  RecordProperty("poisson_max_overshoot_permille", static_cast<int>(1000 * worst.overshoot));
  RecordProperty("poisson_max_disagreement_permille", static_cast<int>(1000 * worst.disagreement));
}

TEST(SlidingWindowAccuracyTest, BurstyTrafficStaysCloseToSlidingLog) {
  Accuracy worst;
  for (const RateBounds& bounds : kRates) {
    const std::string_view rate_text = bounds.rate;
    const Rate rate = MustParseRate(rate_text);
    for (const double gap : {0.3, 0.7, 1.0, 2.0}) {
      for (uint64_t seed : kSlidingWindowAccuracySeeds) {
        const Accuracy a =
            Measure(rate_text, BurstyTrace(seed, rate, gap, kSlidingWindowAccuracySteps));
        Print("bursty " + std::string(rate_text) + " gap " + std::to_string(gap).substr(0, 3) +
                  "p seed " + std::to_string(seed),
              a);
        EXPECT_LE(a.log_overshoot, 1.0);
        EXPECT_LE(a.overshoot, kMaxBurstyOvershoot) << rate_text << " gap " << gap;
        EXPECT_LE(a.disagreement, kMaxDisagreement) << rate_text << " gap " << gap;
        worst.overshoot = std::max(worst.overshoot, a.overshoot);
        worst.disagreement = std::max(worst.disagreement, a.disagreement);
        worst.throughput = std::max(worst.throughput, a.throughput);
      }
    }
  }
  Print("bursty worst case", worst);
  RecordProperty("bursty_max_overshoot_permille", static_cast<int>(1000 * worst.overshoot));
  RecordProperty("bursty_max_disagreement_permille", static_cast<int>(1000 * worst.disagreement));
}

// The worst case, built: `limit` requests in the last microsecond of a
// window, then a request every period/1000 through the next window. The
// estimate weighs the previous window by the part of it still inside the
// sliding period, assuming its requests were spread evenly; here they all
// sit at its end, so nearly a second `limit` fits into the period that
// starts at them: the overshoot approaches, and never passes, 2x.
TEST(SlidingWindowAccuracyTest, PathologicalTraceApproachesButNeverExceedsTwiceTheLimit) {
  for (std::string_view rate_text : {"100/min", "40/min", "10/s"}) {
    const Rate rate = MustParseRate(rate_text);
    const int64_t period = rate.period.micros();
    const Time boundary = kTraceOrigin + rate.period * 10;
    std::vector<Request> trace;
    for (int64_t k = 0; k < rate.limit; ++k) trace.push_back({boundary - Duration::Micros(1), 1});
    for (int64_t k = 0; k < 1000; ++k) {
      trace.push_back({boundary + Duration::Micros(period * k / 1000), 1});
    }
    const Accuracy a = Measure(rate_text, trace);
    Print("pathological " + std::string(rate_text), a);
    EXPECT_LE(a.overshoot, 2.0);
    EXPECT_GE(a.overshoot, 1.9) << "the construction should come close to 2x";
    EXPECT_LE(a.log_overshoot, 1.0);
  }
}

}  // namespace
}  // namespace sluice::conformance
