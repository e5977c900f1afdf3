#include "server/sim_request.h"

#include <string>
#include <utility>
#include <vector>

#include "base/cat.h"
#include "policy/request_text.h"
#include "server/json_body.h"
#include "sim/builtin.h"
#include "sim/scenario_file.h"

namespace sluice::server {

using internal::Cat;

absl::StatusOr<SimRequest> ParseSimRequest(std::string_view body) {
  // A scenario is two levels deep; a body nested deeper is refused before
  // it is parsed, as the decision API's are.
  if (!policy::JsonDepthWithin(body, policy::kMaxJsonDepth)) {
    return absl::InvalidArgumentError(
        Cat("the body nests arrays and objects deeper than ", policy::kMaxJsonDepth, " levels"));
  }
  std::optional<std::string> twice;
  const nlohmann::json j = ParseJsonBody(body, twice);
  if (twice) return absl::InvalidArgumentError(Cat("the body names \"", *twice, "\" twice"));
  if (!j.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  for (const auto& [name, value] : j.items()) {
    if (name != "scenario" && name != "yaml" && name != "seed" && name != "limiters") {
      return absl::InvalidArgumentError(Cat("unknown field \"", name, "\""));
    }
  }
  const bool named = j.contains("scenario"), pasted = j.contains("yaml");
  if (named == pasted) {
    return absl::InvalidArgumentError(
        "give either \"scenario\" (a built-in scenario's name) or \"yaml\" (a scenario file)");
  }
  SimRequest ask;
  if (named) {
    if (!j["scenario"].is_string())
      return absl::InvalidArgumentError("\"scenario\" must be a string");
    absl::StatusOr<sim::Scenario> s = sim::LoadBuiltin(j["scenario"].get<std::string>());
    if (!s.ok()) return s.status();
    ask.scenario = *std::move(s);
  } else {
    if (!j["yaml"].is_string()) return absl::InvalidArgumentError("\"yaml\" must be a string");
    absl::StatusOr<sim::Scenario> s =
        sim::ParseScenario(j["yaml"].get<std::string>(), "scenario", "scenario");
    if (!s.ok()) return s.status();
    ask.scenario = *std::move(s);
  }
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned()) {
      return absl::InvalidArgumentError("\"seed\" must be a non-negative integer");
    }
    ask.seed = j["seed"].get<uint64_t>();
  } else {
    ask.seed = ask.scenario.seed;
  }
  if (j.contains("limiters")) {
    const nlohmann::json& wanted = j["limiters"];
    if (!wanted.is_array() || wanted.empty()) {
      return absl::InvalidArgumentError("\"limiters\" must be a non-empty array of names");
    }
    std::vector<sim::LimiterSetup> kept;
    for (const nlohmann::json& name : wanted) {
      if (!name.is_string())
        return absl::InvalidArgumentError("\"limiters\" holds names (strings)");
      bool found = false;
      for (const sim::LimiterSetup& setup : ask.scenario.limiters) {
        if (setup.name == name.get<std::string>()) {
          if (!found) kept.push_back(setup);
          found = true;
        }
      }
      if (!found) {
        return absl::InvalidArgumentError(
            Cat("the scenario has no limiter named \"", name.get<std::string>(), "\""));
      }
    }
    ask.scenario.limiters = std::move(kept);
  }
  int64_t clients = 0;
  for (const sim::ClientGroup& g : ask.scenario.groups) clients += g.clients;
  if (clients > kMaxSimClients || ask.scenario.limiters.size() > kMaxSimLimiters ||
      ask.scenario.instances > kMaxSimInstances) {
    return absl::OutOfRangeError(Cat("the admin listener simulates at most ", kMaxSimClients,
                                     " clients, ", kMaxSimLimiters, " limiters and ",
                                     kMaxSimInstances,
                                     " instances; run larger scenarios with `sluice sim FILE`"));
  }
  ask.scenario.max_attempts = kMaxSimAttempts;
  return ask;
}

}  // namespace sluice::server
