// What `sluice sim` prints: the runs of a scenario as a text table, CSV or
// JSON. Internal to the simulator.
//
// Output is a pure function of the Result: numbers are integers or fixed
// to three decimals and durations are written in milliseconds, so the same
// seed prints the same bytes.
//
//   std::cout << sluice::sim::FormatText(*result);
#ifndef SLUICE_SIM_REPORT_H_
#define SLUICE_SIM_REPORT_H_

#include <string>

#include "sim/engine.h"

namespace sluice::sim {

// One row per metric, one column per limiter, and a legend of the metrics.
std::string FormatText(const Result& result);
// One header row, then one row per limiter.
std::string FormatCsv(const Result& result);
// {"scenario": ..., "runs": [{"name": ..., "metrics": {...}, "series": {...}}]}
std::string FormatJson(const Result& result);

}  // namespace sluice::sim

#endif  // SLUICE_SIM_REPORT_H_
