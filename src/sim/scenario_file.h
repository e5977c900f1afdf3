// Scenario files: a Scenario written in YAML (docs/simulator.md documents
// every key). Internal to the simulator.
//
// The whole file is validated before anything runs. An error names the
// file, the line and the key, in the form the config loader uses
// ("storm.yaml:12: clients[0].traffic[1].poisson: ..."), and unknown keys are
// errors, so a typo never silently changes the traffic.
//
// Thread-safety: reentrant.
//
//   absl::StatusOr<sluice::sim::Scenario> s = sluice::sim::LoadScenarioFile("storm.yaml");
//   if (!s.ok()) std::cerr << s.status().message() << "\n";
#ifndef SLUICE_SIM_SCENARIO_FILE_H_
#define SLUICE_SIM_SCENARIO_FILE_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "sim/scenario.h"

namespace sluice::sim {

absl::StatusOr<Scenario> LoadScenarioFile(const std::string& path);

// `source` names the text in errors; `default_name` is the scenario's name
// when the text has no `name:`.
absl::StatusOr<Scenario> ParseScenario(std::string_view yaml, const std::string& source,
                                       const std::string& default_name);

}  // namespace sluice::sim

#endif  // SLUICE_SIM_SCENARIO_FILE_H_
