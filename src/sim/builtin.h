// The built-in scenarios: the seed articles' examples, runnable by name
// (`sluice sim login-storm`). Internal to the simulator.
//
// Each is written as a scenario file, in the same YAML a user writes, and
// read by the same parser: `sluice sim --print NAME` prints it as a starting
// point for one's own.
//
//   absl::StatusOr<sluice::sim::Scenario> s = sluice::sim::LoadBuiltin("fleet");
#ifndef SLUICE_SIM_BUILTIN_H_
#define SLUICE_SIM_BUILTIN_H_

#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "sim/scenario.h"

namespace sluice::sim {

struct BuiltinScenario {
  std::string_view name;
  std::string_view summary;  // one line, for --list
  std::string_view yaml;
};

// In a fixed order: login-storm, boundary-burst, retry-wave, fleet.
std::span<const BuiltinScenario> BuiltinScenarios();

// The scenario by name; NotFound naming the built-in ones otherwise.
absl::StatusOr<Scenario> LoadBuiltin(std::string_view name);

}  // namespace sluice::sim

#endif  // SLUICE_SIM_BUILTIN_H_
