// The endpoints of `sluice serve` that answer by themselves (the gateway,
// which forwards, is gateway.h): each a coroutine on the request's loop
// that returns its answer as a value. The transport (server.cc) reads the
// request, picks the endpoint and writes the answer.
#ifndef SLUICE_SERVER_ENDPOINTS_H_
#define SLUICE_SERVER_ENDPOINTS_H_

#include <optional>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"
#include "policy/evaluation.h"
#include "policy/policy_set.h"
#include "server/answer.h"
#include "server/loop.h"

namespace sluice::server {

// POST /v1/check (check_endpoint.cc, with check_api.h): one check or a
// batch. CheckNow answers at once, without a coroutine frame of its own, a
// POST of one flat check (the common shape) whose policy is in this process,
// or whose error needs no decision; nullopt, having decided nothing, for the
// rest, which CheckEndpoint answers (a body read once either way but for a
// flat check of a policy in Redis).
std::optional<HttpAnswer> CheckNow(Context& ctx, std::string_view method, std::string_view body);
Task<HttpAnswer> CheckEndpoint(Context& ctx, std::string_view method, std::string_view body);

// POST /json (check_endpoint.cc): envoyproxy/ratelimit's JSON form of
// ShouldRateLimit, decided by the envoy rules (envoy::RlsServer::DecideJson);
// 404 without grpc.listen.
Task<HttpAnswer> RlsJsonEndpoint(Context& ctx, std::string_view method, std::string_view body);

// POST /v1/acquire, /v1/renew and /v1/release (lease_endpoint.cc): slots of
// concurrency limits held by callers of the decision API, with lease tokens
// (lease_token.h). `path` is one of the three.
Task<HttpAnswer> LeaseEndpoint(Context& ctx, std::string_view path, std::string_view method,
                               std::string_view body);

// POST /v1/settle (lease_endpoint.cc): a reservation a check with "settle"
// gave, settled at its true cost (docs/settled-costs.md).
Task<HttpAnswer> SettleEndpoint(Context& ctx, std::string_view method, std::string_view body);

// `,"reservation":{...}` for a check with "settle" that `applied` admitted
// and took (lease_endpoint.cc). REQUIRES: SettleableCheck.
std::string ReservationJson(Context& ctx, const policy::Applied& applied,
                            const PolicyDecision& taken);
// Why `policy` cannot settle a reservation (a limit that cannot carry debt),
// or nullopt.
std::optional<std::string> UnsettleablePolicy(const policy::Policy& policy);

// GET /v1/auth and /v1/auth/{policy} (auth_endpoint.cc): NGINX
// auth_request. `facts` describe the original request (X-Original-*);
// `policy` names the one policy to apply, empty for every policy whose match
// fits. 204 admits; 403 (mapped to 429 by `error_page 403 =429`) denies,
// with Retry-After and the RateLimit fields. Answered at once when every
// policy that applies is in this process (no coroutine frame of its own);
// nullopt otherwise. With `later`, the policies are then left there for
// AuthLater, which decides them in Redis (`later` must outlive it);
// without, nothing is made for them.
//
//   std::vector<policy::Applied> applied;
//   std::optional<HttpAnswer> now = AuthNow(ctx, facts, policy, &applied);
//   if (now) answer = *std::move(now); else answer = co_await AuthLater(ctx, applied);
std::optional<HttpAnswer> AuthNow(Context& ctx, const policy::RequestFacts& facts,
                                  std::string_view policy, std::vector<policy::Applied>* later);
Task<HttpAnswer> AuthLater(Context& ctx, const std::vector<policy::Applied>& applied);

// The admin listener (admin.cc): /metrics /healthz /readyz /v1/config
// /v1/status /v1/series /v1/top /v1/keys/{policy}/{key} /v1/quota
// /v1/sim/scenarios (GET and HEAD), and POST /v1/sim.
Task<HttpAnswer> AdminEndpoint(Context& ctx, std::string_view method, std::string_view target,
                               std::string_view body);

// POST /v1/sim (sim_endpoint.cc): a built-in or posted scenario through the
// simulator, answered as `sluice sim --format json` prints it; bounded in
// size and work, one at a time, off the event loops.
Task<HttpAnswer> SimEndpoint(Context& ctx, std::string_view method, std::string_view body);
// GET /v1/sim/scenarios: the built-in scenarios, with their YAML.
nlohmann::json SimScenariosJson();

}  // namespace sluice::server

#endif  // SLUICE_SERVER_ENDPOINTS_H_
