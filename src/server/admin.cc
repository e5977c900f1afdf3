// The admin listener: metrics, health, readiness, the config in force, one
// key's state, the decisions of the last minutes, the keys denied most, and
// the simulator. GET and HEAD, and POST for a simulation; nothing here
// changes anything.
#include <charconv>
#include <string>
#include <vector>

#include "base/cat.h"
#include "nlohmann/json.hpp"
#include "policy/request_text.h"
#include "server/endpoints.h"
#include "web/assets.h"

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
        case KeyPart::Kind::kClientCert:
          key.push_back("client_cert");
          break;
      }
    }
    nlohmann::json entry = {
        {"name", p.name()},
        {"key", key},
        {"limits", limits},
        {"shadow", p.config().shadow},
        {"on_missing_key", p.config().on_missing_key == MissingKey::kDeny ? "deny" : "client_ip"},
        {"client_ip_prefix",
         {{"ipv4", p.config().client_ip_prefix.ipv4}, {"ipv6", p.config().client_ip_prefix.ipv6}}},
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
    nlohmann::json route = {
        {"name", r.name},
        {"upstream", Cat(r.upstream_tls ? "https://" : "http://", HostPortText(r.upstream))}};
    if (r.websocket) route["websocket"] = true;
    if (r.upstream_timeout > Duration::Zero()) {
      route["upstream_timeout"] = FormatDuration(r.upstream_timeout);
    }
    if (r.idle_timeout > Duration::Zero()) route["idle_timeout"] = FormatDuration(r.idle_timeout);
    if (r.max_body_bytes) route["max_body_bytes"] = *r.max_body_bytes;
    if (r.StreamsUploads(set.config().server.max_body_bytes)) {
      route["min_upload_rate"] = r.MinUploadRate();
    }
    routes.push_back(std::move(route));
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
  const Decisions state = co_await Await<Decisions>(ctx.worker, [&](InspectCallback done) {
    limiter.InspectAsync(*key, now, 0, std::move(done));
  });
  const Decisions next = co_await Await<Decisions>(ctx.worker, [&](InspectCallback done) {
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
                        {"remaining", (*state)[i].remaining},
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

// The value of `name` in the query of `target` as a count in [1, max], or
// `otherwise` when absent or not such a number.
size_t QueryCount(std::string_view target, std::string_view name, size_t otherwise, size_t max) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return otherwise;
  std::string_view query = target.substr(q + 1);
  while (!query.empty()) {
    const std::string_view pair = query.substr(0, query.find('&'));
    query.remove_prefix(std::min(query.size(), pair.size() + 1));
    if (pair.size() <= name.size() || pair.substr(0, name.size()) != name ||
        pair[name.size()] != '=') {
      continue;
    }
    const std::string_view value = pair.substr(name.size() + 1);
    size_t n = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || end != value.data() + value.size() || n == 0) return otherwise;
    return std::min(n, max);
  }
  return otherwise;
}

// GET /v1/series: each policy's decisions per second (DecisionSeries).
nlohmann::json SeriesJson(const ServerState& state, size_t seconds) {
  const DecisionSeries::View view = state.series.Last(seconds);
  nlohmann::json policies = nlohmann::json::object();
  for (const auto& [name, outcomes] : view.policies) {
    nlohmann::json p = nlohmann::json::object();
    for (size_t o = 0; o < outcomes.size(); ++o) p[DecisionSeries::kOutcomeNames[o]] = outcomes[o];
    policies[name] = std::move(p);
  }
  return {{"interval_ms", 1000}, {"end_ms", view.end_unix_ms}, {"policies", policies}};
}

constexpr size_t kTopDefault = 10;
constexpr size_t kTopMax = metrics::TopKeys::kCapacity;
constexpr int64_t kTopWindowSeconds =
    static_cast<int64_t>(metrics::TopKeys::kEpochs) * metrics::TopKeys::kEpochSeconds;

// A policy's keys denied most (metrics::TopKeys), most first.
nlohmann::json TopJson(const Policy& p, size_t n, Time now) {
  nlohmann::json keys = nlohmann::json::array();
  if (p.top_keys() != nullptr) {
    for (const metrics::TopKeys::Entry& e : p.top_keys()->Top(n, now)) {
      keys.push_back({{"key", e.key}, {"denied", e.count}, {"error", e.error}});
    }
  }
  return keys;
}

// GET /v1/status: the process, where its config came from, the stores.
nlohmann::json StatusJson(const ServerState& state, const PolicySet& set) {
  nlohmann::json config = {{"source", set.config().source}};
  if (state.source != nullptr) {
    const ConfigSource::History h = state.source->history();
    config["loaded_at_ms"] = h.loaded_at_unix_ms;
    config["reloads"] = {{"ok", h.reloads_ok}, {"failed", h.reloads_failed}};
    config["last_reload_error"] =
        h.last_error.empty()
            ? nlohmann::json(nullptr)
            : nlohmann::json{{"at_ms", h.failed_at_unix_ms}, {"message", h.last_error}};
  }
  const MemoryStoreStats m = state.store.stats();
  nlohmann::json store = {
      {"memory",
       {{"keys", m.keys},
        {"max_keys", state.store.options().max_keys},
        {"fresh_evictions", m.fresh_evictions},
        {"forced_evictions", m.forced_evictions},
        {"on_full", state.config.store.on_full == OnFull::kRemember  ? "remember"
                    : state.config.store.on_full == OnFull::kDenyNew ? "deny_new"
                                                                     : "evict"},
        {"remembered", m.remembered},
        {"recalled", m.recalled},
        {"denied_new", m.denied_new},
        {"remembered_bytes", m.remembered_bytes}}},
      {"redis", nullptr}};
  if (state.redis != nullptr) {
    const RedisStoreHealth h = state.redis->Health();
    store["redis"] = {
        {"up", h.up},
        {"server", h.server.empty() ? nlohmann::json(nullptr) : nlohmann::json(h.server)},
        {"tls", h.tls},
        {"nodes", h.nodes},
        {"nodes_up", h.nodes_up},
        {"calls", h.calls},
        {"errors", h.errors},
        {"timeouts", h.timeouts},
        {"reconnects", h.reconnects},
        {"denials_answered", h.denials_answered}};
  }
  // The listeners, where they were bound, and whether they speak TLS
  // (mutual: a client certificate required); fixed at start.
  nlohmann::json listeners = nlohmann::json::array();
  const auto listener = [&listeners](std::string_view name, const HostPort& where, uint16_t port,
                                     const std::optional<ListenerTls>& tls) {
    listeners.push_back({{"name", name},
                         {"listen", HostPortText({where.host, port})},
                         {"tls", !tls                          ? "off"
                                 : tls->client_ca_file.empty() ? "on"
                                                               : "mutual"}});
  };
  const Config& started = state.config;
  listener("main", started.server.listen, state.ports.main, started.server.tls);
  if (started.server.decision.listen && state.ports.decision != 0) {
    listener("decision", *started.server.decision.listen, state.ports.decision,
             started.server.decision.tls);
  }
  listener("admin", started.server.admin, state.ports.admin, std::nullopt);
  if (started.grpc && state.ports.grpc != 0) {
    listener("grpc", started.grpc->listen, state.ports.grpc, started.grpc->tls);
  }
  return {{"version", SLUICE_VERSION_STRING},
          {"started_at_ms", state.started_at_unix_ms},
          {"draining", state.draining.load()},
          {"config", config},
          {"listeners", listeners},
          {"store", store}};
}

// The dashboard's page may run only its own script and style, and talk only
// to this listener: whatever a key or an error message holds, it cannot load
// or send anything elsewhere (docs/dashboard.md).
constexpr std::string_view kDashboardPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

// A file of the dashboard (src/web/), built into the binary.
HttpAnswer DashboardFile(const web::Asset& asset) {
  return {200,
          asset.content_type,
          std::string(asset.body),
          {{"Content-Security-Policy", std::string(kDashboardPolicy)},
           {"X-Content-Type-Options", "nosniff"},
           {"Referrer-Policy", "no-referrer"},
           {"Cache-Control", "no-cache"}}};
}

}  // namespace

Task<HttpAnswer> AdminEndpoint(Context& ctx, std::string_view method, std::string_view target,
                               std::string_view body) {
  const std::string_view path = target.substr(0, target.find('?'));
  if (path == "/v1/sim") co_return co_await SimEndpoint(ctx, method, body);
  if (method != "GET" && method != "HEAD") {
    co_return HttpAnswer::Problem(405, "method not allowed",
                                  "the admin listener answers GET (and POST /v1/sim)");
  }
  if (const web::Asset* asset = web::FindAsset(path)) co_return DashboardFile(*asset);
  ServerState& state = ctx.state;
  if (path == "/metrics") {
    co_return HttpAnswer{
        200, "text/plain; version=0.0.4; charset=utf-8", state.metrics.Render(), {}};
  }
  if (path == "/healthz") co_return HttpAnswer::Text(200, "ok\n");
  if (path == "/readyz") {
    const std::string why = state.NotReady();
    co_return why.empty() ? HttpAnswer::Text(200, "ready\n") : HttpAnswer::Text(503, why + "\n");
  }
  if (path == "/v1/config") co_return HttpAnswer::Json(200, ConfigJson(*ctx.set).dump(2));
  if (path.substr(0, 9) == "/v1/keys/") co_return co_await KeyState(ctx, path.substr(9));
  if (path == "/v1/quota") co_return HttpAnswer::Json(200, QuotaJson(state).dump(2));
  if (path == "/v1/status") co_return HttpAnswer::Json(200, StatusJson(state, *ctx.set).dump(2));
  if (path == "/v1/series") {
    const size_t seconds =
        QueryCount(target, "seconds", DecisionSeries::kSeconds, DecisionSeries::kSeconds);
    co_return HttpAnswer::Json(200, SeriesJson(state, seconds).dump());
  }
  if (path == "/v1/top" || path.substr(0, 8) == "/v1/top/") {
    const size_t n = QueryCount(target, "n", kTopDefault, kTopMax);
    const Time now = state.clock->Now();
    if (path == "/v1/top") {
      nlohmann::json policies = nlohmann::json::object();
      for (const Policy& p : ctx.set->policies()) policies[p.name()] = TopJson(p, n, now);
      co_return HttpAnswer::Json(
          200, nlohmann::json{{"window_s", kTopWindowSeconds}, {"policies", policies}}.dump(2));
    }
    std::optional<std::string> name = policy::PercentDecode(path.substr(8));
    if (!name) co_return HttpAnswer::Problem(400, "bad request", "bad percent-encoding");
    const Policy* p = ctx.set->Find(*name);
    if (p == nullptr) {
      co_return HttpAnswer::Problem(404, "unknown policy", Cat("no policy named \"", *name, "\""));
    }
    co_return HttpAnswer::Json(200, nlohmann::json{{"policy", *name},
                                                   {"window_s", kTopWindowSeconds},
                                                   {"keys", TopJson(*p, n, now)}}
                                        .dump(2));
  }
  if (path == "/v1/sim/scenarios") co_return HttpAnswer::Json(200, SimScenariosJson().dump(2));
  co_return HttpAnswer::Problem(
      404, "not found",
      "admin endpoints: / (the dashboard) /metrics /healthz /readyz /v1/config /v1/status "
      "/v1/series /v1/top "
      "/v1/top/{policy} /v1/keys/{policy}/{key} /v1/quota /v1/sim/scenarios, POST /v1/sim");
}

std::string ServerState::NotReady() const {
  if (draining.load()) return "draining";
  if (redis != nullptr) {
    const RedisStoreHealth h = redis->Health();
    if (!h.up) {
      return Cat("store unavailable: redis, ", h.nodes_up, " of ", h.nodes, " masters connected");
    }
  }
  return "";
}

}  // namespace sluice::server
