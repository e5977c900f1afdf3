// POST /v1/sim and GET /v1/sim/scenarios on the admin listener: the
// simulator of `sluice sim` (src/sim/), run on a scenario sent by the
// dashboard. The same code decides as in `sluice sim`; only the bounds are
// tighter, since anyone who reaches the admin listener may send one.
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "base/cat.h"
#include "nlohmann/json.hpp"
#include "server/endpoints.h"
#include "server/sim_request.h"
#include "sim/builtin.h"
#include "sim/engine.h"
#include "sim/report.h"

namespace sluice::server {

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
  using internal::Cat;
  if (method != "POST") {
    co_return HttpAnswer::Problem(405, "method not allowed", "POST a scenario to /v1/sim");
  }
  if (body.size() > kMaxSimBodyBytes) {
    co_return HttpAnswer::Problem(413, "payload too large",
                                  Cat("a scenario of at most ", kMaxSimBodyBytes, " bytes"));
  }
  absl::StatusOr<SimRequest> ask = ParseSimRequest(body);
  if (!ask.ok()) {
    const bool big = absl::IsOutOfRange(ask.status());
    co_return HttpAnswer::Problem(big ? 422 : 400, big ? "scenario too large" : "bad scenario",
                                  std::string(ask.status().message()));
  }
  ServerState& state = ctx.state;
  if (state.simulating.exchange(true)) {
    HttpAnswer busy = HttpAnswer::Problem(429, "busy", "a simulation is running; try again");
    busy.headers.Add("Retry-After", "1");
    co_return busy;
  }
  // The previous simulation's thread has ended (it cleared `simulating`
  // last thing); only this loop starts and joins them.
  if (state.simulation.joinable()) state.simulation.join();
  using Result = absl::StatusOr<std::string>;
  const Result result = co_await Await<Result>(ctx.worker, [&](auto done) {
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
