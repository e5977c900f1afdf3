// POST /v1/sim and GET /v1/sim/scenarios on the admin listener: the
// simulator of `sluice sim` (src/sim/), run on a scenario sent by the
// dashboard. The same code decides as in `sluice sim`; only the bounds are
// tighter, since anyone who reaches the admin listener may send one.
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "base/cat.h"
#include "nlohmann/json.hpp"
#include "policy/request_text.h"
#include "server/endpoints.h"
#include "sim/builtin.h"
#include "sim/engine.h"
#include "sim/report.h"
#include "sim/scenario_file.h"

namespace sluice::server {
// (A named namespace: see check_endpoint.cc.)
namespace sim_endpoint {

using internal::Cat;

// Bounds of one simulation asked for over HTTP: the work (events) and
// memory (clients) of a run, and so its time: well under a second for the
// built-in scenarios, a few seconds at worst, on a thread of its own.
constexpr size_t kMaxBodyBytes = 64 * 1024;
constexpr int64_t kMaxAttempts = 1'000'000;  // requests and retries per limiter
constexpr int64_t kMaxClients = 100'000;
constexpr size_t kMaxLimiters = 8;
constexpr int64_t kMaxInstances = 64;

struct Ask {
  sim::Scenario scenario;
  uint64_t seed = 1;
};

// The scenario the body names or holds, within the bounds above.
absl::StatusOr<Ask> Parse(std::string_view body) {
  // A scenario is two levels deep; a body nested deeper is refused before
  // it is parsed, as the decision API's are.
  if (!policy::JsonDepthWithin(body, policy::kMaxJsonDepth)) {
    return absl::InvalidArgumentError(
        Cat("the body nests arrays and objects deeper than ", policy::kMaxJsonDepth, " levels"));
  }
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
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
  Ask ask;
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
  if (clients > kMaxClients || ask.scenario.limiters.size() > kMaxLimiters ||
      ask.scenario.instances > kMaxInstances) {
    return absl::OutOfRangeError(Cat("the admin listener simulates at most ", kMaxClients,
                                     " clients, ", kMaxLimiters, " limiters and ", kMaxInstances,
                                     " instances; run larger scenarios with `sluice sim FILE`"));
  }
  ask.scenario.max_attempts = kMaxAttempts;
  return ask;
}

}  // namespace sim_endpoint

nlohmann::json SimScenariosJson() {
  nlohmann::json list = nlohmann::json::array();
  for (const sim::BuiltinScenario& s : sim::BuiltinScenarios()) {
    list.push_back({{"name", std::string(s.name)},
                    {"summary", std::string(s.summary)},
                    {"yaml", std::string(s.yaml)}});
  }
  return {{"scenarios", list}};
}

Task<HttpAnswer> SimEndpoint(Context& ctx, std::string_view method, std::string_view body) {
  using namespace sim_endpoint;
  if (method != "POST") {
    co_return HttpAnswer::Problem(405, "method not allowed", "POST a scenario to /v1/sim");
  }
  if (body.size() > kMaxBodyBytes) {
    co_return HttpAnswer::Problem(413, "payload too large",
                                  Cat("a scenario of at most ", kMaxBodyBytes, " bytes"));
  }
  absl::StatusOr<Ask> ask = Parse(body);
  if (!ask.ok()) {
    const bool big = absl::IsOutOfRange(ask.status());
    co_return HttpAnswer::Problem(big ? 422 : 400, big ? "scenario too large" : "bad scenario",
                                  std::string(ask.status().message()));
  }
  ServerState& state = ctx.state;
  if (state.simulating.exchange(true)) {
    HttpAnswer busy = HttpAnswer::Problem(429, "busy", "a simulation is running; try again");
    busy.headers.emplace_back("Retry-After", "1");
    co_return busy;
  }
  // The previous simulation's thread has ended (it cleared `simulating`
  // last thing); only this loop starts and joins them.
  if (state.simulation.joinable()) state.simulation.join();
  using Result = absl::StatusOr<std::string>;
  const Result result = co_await Await<Result>(ctx.worker.ioc, [&](auto done) {
    state.simulation = std::thread([&state, ask = *std::move(ask), done = std::move(done)] {
      absl::StatusOr<sim::Result> r = sim::Simulate(ask.scenario, ask.seed);
      Result out = r.ok() ? Result(sim::FormatJson(*r)) : Result(r.status());
      state.simulating.store(false);
      done(std::move(out));
    });
  });
  if (!result.ok()) {
    const bool big = absl::IsResourceExhausted(result.status());
    co_return HttpAnswer::Problem(big ? 422 : 400, big ? "scenario too large" : "bad scenario",
                                  std::string(result.status().message()));
  }
  co_return HttpAnswer::Json(200, *result);
}

}  // namespace sluice::server
