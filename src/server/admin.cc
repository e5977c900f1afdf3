// The admin listener: metrics, health, readiness, the config in force and
// one key's state. GET and HEAD only; nothing here changes anything.
#include <string>
#include <vector>

#include "base/cat.h"
#include "nlohmann/json.hpp"
#include "policy/request_text.h"
#include "server/endpoints.h"

namespace sluice::server {
namespace {

using internal::Cat;
using policy::Policy;
using policy::PolicySet;

// The policies and routes in force, for GET /v1/config.
nlohmann::json ConfigJson(const PolicySet& set) {
  nlohmann::json policies = nlohmann::json::array();
  for (const Policy& p : set.policies()) {
    nlohmann::json limits = nlohmann::json::array();
    for (const LimitSpec& spec : p.config().limits) {
      nlohmann::json l = {{"algorithm", std::string(AlgorithmName(spec.options.algorithm))},
                          {"scope", spec.scope == Scope::kLocal ? "local" : "global"}};
      if (spec.options.algorithm == Algorithm::kConcurrency) {
        l["limit"] = spec.options.rate.limit;
        l["lease_ttl"] = FormatDuration(
            spec.options.lease_ttl == Duration::Zero() ? kDefaultLeaseTtl : spec.options.lease_ttl);
      } else {
        l["rate"] = FormatRate(spec.options.rate);
      }
      if (spec.options.burst != 0) l["burst"] = spec.options.burst;
      if (spec.options.algorithm == Algorithm::kLeakyBucket) {
        l["mode"] = spec.options.mode == LeakyMode::kShape ? "shape" : "police";
        if (spec.options.max_delay > Duration::Zero())
          l["max_delay"] = FormatDuration(spec.options.max_delay);
        if (spec.options.queue > 0) l["queue"] = spec.options.queue;
      }
      if (spec.lease) {
        l["lease"] = {{"size", spec.lease->size == 0 ? nlohmann::json("auto")
                                                     : nlohmann::json(spec.lease->size)},
                      {"ttl", FormatDuration(spec.lease->ttl)}};
      }
      limits.push_back(l);
    }
    nlohmann::json key = nlohmann::json::array();
    for (const KeyPart& part : p.config().key) {
      switch (part.kind) {
        case KeyPart::Kind::kClientIp:
          key.push_back("client_ip");
          break;
        case KeyPart::Kind::kHeader:
          key.push_back("header:" + part.header);
          break;
        case KeyPart::Kind::kPath:
          key.push_back("path");
          break;
        case KeyPart::Kind::kRoute:
          key.push_back("route");
          break;
        case KeyPart::Kind::kGlobal:
          key.push_back("global");
          break;
      }
    }
    nlohmann::json entry = {
        {"name", p.name()},
        {"key", key},
        {"limits", limits},
        {"shadow", p.config().shadow},
        {"on_missing_key", p.config().on_missing_key == MissingKey::kDeny ? "deny" : "client_ip"},
        {"long_keys", p.config().long_keys == LongKeys::kHash ? "hash" : "refuse"},
        {"on_deny", {{"status", p.config().on_deny.status}}}};
    if (p.config().cost != CostConfig{}) {
      entry["cost"] = {{"estimate", p.config().cost.estimate}};
      if (!p.config().cost.response_header.empty()) {
        entry["cost"]["settle"] = "response_header:" + p.config().cost.response_header;
      }
    }
    if (p.config().on_deny.retry_after_jitter) {
      entry["on_deny"]["retry_after_jitter"] =
          FormatDuration(*p.config().on_deny.retry_after_jitter);
    }
    if (p.config().match) {
      const MatchConfig& m = *p.config().match;
      nlohmann::json match = nlohmann::json::object();
      if (m.path_prefix) match["path_prefix"] = *m.path_prefix;
      if (m.path) match["path"] = *m.path;
      if (m.method) match["method"] = *m.method;
      if (m.host) match["host"] = *m.host;
      if (!m.headers.empty()) match["headers"] = m.headers;
      entry["match"] = match;
    }
    policies.push_back(entry);
  }
  nlohmann::json routes = nlohmann::json::array();
  for (const RouteConfig& r : set.config().routes) {
    routes.push_back(
        {{"name", r.name}, {"upstream", Cat("http://", r.upstream.host, ":", r.upstream.port)}});
  }
  return {{"source", set.config().source}, {"policies", policies}, {"routes", routes}};
}

// GET /v1/keys/{policy}/{key}: each limit's state for the key, and what it
// would answer to the next request (taking nothing).
Task<HttpAnswer> KeyState(Context& ctx, std::string_view rest) {
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) {
    co_return HttpAnswer::Problem(400, "bad request", "use /v1/keys/{policy}/{key}");
  }
  std::optional<std::string> name = policy::PercentDecode(rest.substr(0, slash));
  std::optional<std::string> key = policy::PercentDecode(rest.substr(slash + 1));
  if (!name || !key) co_return HttpAnswer::Problem(400, "bad request", "bad percent-encoding");
  const Policy* policy = ctx.set->Find(*name);
  if (policy == nullptr || !policy->has_limiter()) {
    co_return HttpAnswer::Problem(404, "unknown policy", Cat("no policy named \"", *name, "\""));
  }
  const Time now = ctx.state.clock->Now();
  using Decisions = absl::StatusOr<std::vector<Decision>>;
  Limiter& limiter = policy->limiter();
  const Decisions state = co_await Await<Decisions>(ctx.worker.ioc, [&](InspectCallback done) {
    limiter.InspectAsync(*key, now, 0, std::move(done));
  });
  const Decisions next = co_await Await<Decisions>(ctx.worker.ioc, [&](InspectCallback done) {
    limiter.InspectAsync(*key, now, 1, std::move(done));
  });
  if (!state.ok() || !next.ok()) {
    const absl::Status& error = state.ok() ? next.status() : state.status();
    const bool bad = absl::IsInvalidArgument(error);
    co_return HttpAnswer::Problem(bad ? 400 : 503, bad ? "bad request" : "store unavailable",
                                  std::string(error.message()));
  }
  nlohmann::json limits = nlohmann::json::array();
  for (size_t i = 0; i < state->size(); ++i) {
    const LimitConfig& c = limiter.limits()[i];
    nlohmann::json l = {{"algorithm", std::string(AlgorithmName(AlgorithmOf(c)))},
                        {"rate", FormatRate(RateOf(c))},
                        {"limit", (*state)[i].limit},
                        {"remaining", std::max<int64_t>(0, (*state)[i].remaining)},
                        {"reset_after_ms", (*state)[i].reset_after.CeilMillis()},
                        {"next_request_allowed", (*next)[i].allowed},
                        {"next_request_retry_after_ms", (*next)[i].retry_after.CeilMillis()},
                        {"next_request_delay_ms", (*next)[i].delay.CeilMillis()}};
    // A leased limit: what this process holds of the key (the state above
    // is Redis', slices of every process counted in it).
    if (i < policy->config().limits.size() && policy->config().limits[i].lease &&
        ctx.state.redis != nullptr) {
      if (auto lease = ctx.state.redis->LeaseOf(c, *name, *key)) {
        l["lease"] = {{"units", lease->units},
                      {"valid_for_ms", lease->valid_for.CeilMillis()},
                      {"window_full", lease->window_full}};
      } else {
        l["lease"] = nullptr;
      }
    }
    limits.push_back(std::move(l));
  }
  const nlohmann::json body = {{"policy", *name}, {"key", *key}, {"limits", limits}};
  co_return HttpAnswer::Json(200, body.dump(2));
}

// The quota service's buckets (docs/envoy.md, "Quota service").
nlohmann::json QuotaJson(const ServerState& state) {
  nlohmann::json buckets = nlohmann::json::array();
  if (state.rls != nullptr) {
    for (const envoy::QuotaBook::BucketView& v : state.rls->QuotaBuckets()) {
      nlohmann::json id = nlohmann::json::object();
      for (const auto& [key, value] : v.bucket) id[key] = value;
      buckets.push_back({{"domain", v.domain},
                         {"bucket_id", id},
                         {"limit_per_s", v.limit},
                         {"envoys", v.streams},
                         {"assigned_per_s", v.assigned},
                         {"in_force_per_s", v.committed},
                         {"reported_allowed", v.allowed},
                         {"reported_denied", v.denied}});
    }
  }
  return {{"buckets", buckets}};
}

}  // namespace

Task<HttpAnswer> AdminEndpoint(Context& ctx, std::string_view method, std::string_view target) {
  const std::string_view path = target.substr(0, target.find('?'));
  if (method != "GET" && method != "HEAD") {
    co_return HttpAnswer::Problem(405, "method not allowed", "the admin listener answers GET");
  }
  ServerState& state = ctx.state;
  if (path == "/metrics") {
    co_return HttpAnswer{
        200, "text/plain; version=0.0.4; charset=utf-8", state.metrics.Render(), {}};
  }
  if (path == "/healthz") co_return HttpAnswer::Text(200, "ok\n");
  if (path == "/readyz") {
    if (state.draining.load()) co_return HttpAnswer::Text(503, "draining\n");
    // Ready means the store is reachable: with Redis down, decisions
    // follow on_store_error, and a balancer should prefer other instances.
    if (state.redis != nullptr) {
      const RedisStoreHealth h = state.redis->Health();
      if (!h.up) {
        co_return HttpAnswer::Text(503, Cat("store unavailable: redis, ", h.nodes_up, " of ",
                                            h.nodes, " masters connected\n"));
      }
    }
    co_return HttpAnswer::Text(200, "ready\n");
  }
  if (path == "/v1/config") co_return HttpAnswer::Json(200, ConfigJson(*ctx.set).dump(2));
  if (path.substr(0, 9) == "/v1/keys/") co_return co_await KeyState(ctx, path.substr(9));
  if (path == "/v1/quota") co_return HttpAnswer::Json(200, QuotaJson(state).dump(2));
  co_return HttpAnswer::Problem(
      404, "not found",
      "admin endpoints: /metrics /healthz /readyz /v1/config /v1/keys/{policy}/{key} /v1/quota");
}

}  // namespace sluice::server
