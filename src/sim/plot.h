// SVG plots of a simulation: requests offered, admitted and rejected over
// time, one panel per limiter on a shared time axis. Internal to the
// simulator.
//
// Made to be read without a legend: each line is labelled in its own colour
// at the right of its panel, level with its peak, and each panel's title
// holds the numbers that matter (admitted, rejected, the most in any period
// against the contract). Deterministic: the same Result gives the same bytes.
//
//   std::ofstream(dir + "/" + result.scenario + ".svg") << sluice::sim::PlotSvg(result);
#ifndef SLUICE_SIM_PLOT_H_
#define SLUICE_SIM_PLOT_H_

#include <string>

#include "sim/engine.h"

namespace sluice::sim {

std::string PlotSvg(const Result& result);

}  // namespace sluice::sim

#endif  // SLUICE_SIM_PLOT_H_
