#include "server_fixture.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "base/cat.h"
#include "nlohmann/json.hpp"
#include "policy/headers.h"
#include "metrics/metrics.h"
#include "policy/request_text.h"
#include "sluice/algorithm.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/store/memory_store.h"

namespace sluice::fuzz {
namespace {

using internal::Cat;
using policy::Policy;
using policy::PolicyAnswer;
using policy::PolicySet;

// Matched on method, path, path prefix, host and header; keyed on
// client_ip, a header (both on_missing_key modes), the path, the route and
// global; every algorithm; both long_keys modes; one shadow policy and one
// the gateway never applies (the decision API only). The decision API's token is read from
// Authorization but does not gate the decisions here, so that the fuzzer
// reaches them without guessing it.
constexpr std::string_view kConfig = R"yaml(
server:
  listen: 127.0.0.1:8080
  admin: 127.0.0.1:9090
  decision: {on_gateway_listener: true, tokens: [fuzz-token-0123456789]}
trusted_proxies: [10.0.0.0/8, "::1", 127.0.0.1/32]
routes:
  - name: login
    match: {path: /login, method: POST}
    upstream: http://127.0.0.1:3000
  - name: api
    match: {path_prefix: /api/, host: api.example.com}
    upstream: http://127.0.0.1:3001
  - name: app
    match: {path_prefix: /}
    upstream: http://127.0.0.1:3000
policies:
  - name: login
    match: {path: /login, method: POST}
    key: [client_ip]
    limits: [{algorithm: sliding_log, rate: 3/min}]
  - name: api
    match: {path_prefix: /api/, headers: [X-Api-Key]}
    key: ["header:X-Api-Key"]
    on_missing_key: deny
    long_keys: refuse
    limits:
      - {algorithm: token_bucket, rate: 5/s, burst: 10}
      - {algorithm: fixed_window, rate: 100/day}
  - name: import
    match: {path_prefix: /api/import, method: POST}
    key: [global]
    limits: [{algorithm: leaky_bucket, mode: shape, rate: 10/s, max_delay: 5s, queue: 20}]
  - name: tenant
    match: {path_prefix: /}
    key: [path, "header:X-Tenant"]
    on_missing_key: client_ip
    limits: [{algorithm: sliding_window, rate: 10/min}]
  - name: per-route
    match: {path_prefix: /, host: app.example.com}
    key: [route, client_ip]
    limits: [{algorithm: gcra, rate: 20/s, burst: 40}]
    shadow: true
  - name: search
    key: [client_ip]
    limits: [{algorithm: leaky_bucket, mode: police, rate: 5/s, burst: 5}]
)yaml";

struct Fixture {
  // A small key budget: the fuzzer sends millions of distinct keys.
  MemoryStore store{{.max_keys = 4096}};
  ManualClock clock{Time::FromUnixMicros(int64_t{1'700'006'400} * 1'000'000)};
  metrics::Metrics metrics;
  std::shared_ptr<const PolicySet> policies;            // real_ip_header: x-forwarded-for
  std::shared_ptr<const PolicySet> forwarded_policies;  // real_ip_header: forwarded
  std::mt19937_64 rng{1};
};

[[noreturn]] void Fail(const absl::Status& status) {
  std::fprintf(stderr, "fuzz fixture: %s\n", std::string(status.message()).c_str());
  std::abort();
}

std::shared_ptr<const PolicySet> Load(Fixture& f, std::string_view text) {
  absl::StatusOr<Config> config = ParseConfig(text, "fuzz.yaml");
  if (!config.ok()) Fail(config.status());
  absl::StatusOr<std::shared_ptr<const PolicySet>> set =
      PolicySet::Create(*config, f.store, nullptr, f.clock, nullptr, f.metrics);
  if (!set.ok()) Fail(set.status());
  return *std::move(set);
}

Fixture& TheFixture() {
  static Fixture* fixture = [] {
    auto* f = new Fixture;
    f->policies = Load(*f, kConfig);
    f->forwarded_policies = Load(*f, Cat(kConfig, "real_ip_header: forwarded\n"));
    return f;
  }();
  return *fixture;
}

absl::StatusOr<PolicyDecision> DecideOn(Limiter& limiter, std::string_view key, Time now,
                                        int64_t cost, bool take) {
  absl::StatusOr<PolicyDecision> d = absl::InternalError("no answer");
  auto keep = [&d](absl::StatusOr<PolicyDecision> r) { d = std::move(r); };
  if (take) {
    limiter.AcquireAsync(key, now, cost, keep);
  } else {
    limiter.CheckAsync(key, now, cost, keep);
  }
  return d;
}

// The JSON object of a bad check, as server.cc's CheckError writes it.
std::string CheckError(int code, std::string_view title, const std::string& detail, int& status) {
  status = code;
  std::string out = "{\"error\":";
  policy::AppendJsonString(out, title);
  out += ",\"detail\":";
  policy::AppendJsonString(out, detail);
  out += Cat(",\"status\":", code, "}");
  return out;
}

// server.cc's DecideChecked: a check whose fields have the right types.
std::string DecideChecked(std::string_view name, std::string_view key, int64_t cost, int& status) {
  Fixture& f = TheFixture();
  const Policy* policy = f.policies->Find(name);
  if (policy == nullptr) {
    return CheckError(404, "unknown policy", Cat("no policy named \"", name, "\""), status);
  }
  if (key.empty()) return CheckError(400, "bad request", "\"key\" must not be empty", status);
  // A key over 1024 bytes is the policy's long_keys to decide.
  absl::StatusOr<PolicyDecision> d = DecideOn(policy->limiter(), key, f.clock.Now(), cost, true);
  if (!d.ok()) return CheckError(400, "bad request", std::string(d.status().message()), status);
  const bool shadow = policy->config().shadow;
  const bool enforced_denial = !d->allowed && !shadow;
  std::string out = Cat("{\"allowed\":", enforced_denial ? "false" : "true", ",\"policy\":");
  policy::AppendJsonString(out, name);
  out += Cat(",\"limit\":", d->limit, ",\"remaining\":", std::max<int64_t>(0, d->remaining),
             ",\"reset_after_ms\":", d->reset_after.CeilMillis(), ",\"retry_after_ms\":");
  out += d->can_never_pass() ? std::string("null") : Cat(d->retry_after.CeilMillis());
  out += Cat(",\"delay_ms\":", d->delay.CeilMillis(), "}");
  status = enforced_denial ? 429 : 200;
  std::vector<PolicyAnswer> answers;
  if (!shadow) {
    answers.push_back({.name = std::string(name), .decision = *d,
                       .window_seconds = policy->WindowSeconds(d->limit_index)});
  }
  std::vector<std::pair<std::string, std::string>> headers;
  policy::AppendRateLimitHeaders(answers, /*legacy=*/true, headers);
  if (enforced_denial && !d->can_never_pass()) {
    (void)policy::RetryAfterSeconds(d->retry_after, policy->JitterFor(d->limit_index), f.rng);
  }
  return out;
}

// server.cc's DecideOne: one check of a JSON body.
std::string DecideOne(const nlohmann::json& item, int& status) {
  if (!item.is_object()) {
    return CheckError(400, "bad request", "each check must be a JSON object", status);
  }
  for (const auto& [k, v] : item.items()) {
    if (k != "policy" && k != "key" && k != "cost") {
      return CheckError(400, "bad request",
                        Cat("unknown field \"", k, "\" (expected policy, key, cost)"), status);
    }
  }
  const auto policy_it = item.find("policy");
  if (policy_it == item.end() || !policy_it->is_string()) {
    return CheckError(400, "bad request", "\"policy\" (a string) is required", status);
  }
  const auto key_it = item.find("key");
  if (key_it == item.end() || !key_it->is_string()) {
    return CheckError(400, "bad request", "\"key\" (a string) is required", status);
  }
  int64_t cost = 1;
  if (const auto c = item.find("cost"); c != item.end()) {
    if (!c->is_number_integer()) {
      return CheckError(400, "bad request", "\"cost\" must be a whole number", status);
    }
    if (c->is_number_unsigned() ? c->get<uint64_t>() > static_cast<uint64_t>(kMaxLimit)
                                : c->get<int64_t>() > kMaxLimit) {
      return CheckError(400, "bad request", Cat("\"cost\" must be at most ", kMaxLimit), status);
    }
    cost = c->get<int64_t>();
    if (cost < 0) return CheckError(400, "bad request", "\"cost\" must not be negative", status);
  }
  return DecideChecked(policy_it->get_ref<const std::string&>(),
                       key_it->get_ref<const std::string&>(), cost, status);
}

// A bad single check is answered as a problem document made from its JSON
// object, read back as server.cc does: it must be JSON.
void ReadBackError(const std::string& result, int status) {
  if (status == 200 || status == 429) return;
  const nlohmann::json error = nlohmann::json::parse(result);
  (void)policy::ErrorBody(status, error["error"].get<std::string>(),
                          error["detail"].get<std::string>());
}

}  // namespace

const PolicySet& Policies(RealIp real_ip) {
  Fixture& f = TheFixture();
  return real_ip == RealIp::kForwarded ? *f.forwarded_policies : *f.policies;
}

void DecideRequest(const PolicySet& set, const std::vector<const Policy*>& applying,
                   const policy::RequestFacts& facts, std::string_view route) {
  Fixture& f = TheFixture();
  const Time now = f.clock.Now();
  const std::vector<Cidr>& trusted = set.config().trusted_proxies;
  // client_ip is the peer, or an address a trusted peer's header names;
  // never anything an untrusted peer wrote.
  const std::string client = policy::ClientIp(facts, trusted, set.config().real_ip_header);
  if (client != facts.peer_ip && (facts.peer_ip != kTrustedPeer || !ParseIp(client))) {
    __builtin_trap();
  }
  // Policies holding a shape limit go last: their departure slot is not given back.
  std::vector<const Policy*> order;
  for (const Policy* p : applying) {
    const auto& limits = p->limiter().limits();
    if (std::none_of(limits.begin(), limits.end(), IsShape)) order.push_back(p);
  }
  for (const Policy* p : applying) {
    if (std::find(order.begin(), order.end(), p) == order.end()) order.push_back(p);
  }
  struct Taken {
    const Policy* policy;
    std::string key;
    PolicyDecision decision;
  };
  std::vector<Taken> taken;
  std::vector<PolicyAnswer> answers;
  std::vector<std::string> violated;
  bool allowed = true;
  bool never = false;  // a denial no wait ends: no Retry-After
  Duration retry;
  Duration jitter;
  for (const Policy* p : order) {
    const bool enforce = !p->config().shadow;
    const std::optional<std::string> key =
        p->KeyFor(facts, route, trusted, set.config().real_ip_header);
    if (!key) {
      if (!enforce) continue;
      allowed = false;
      never = true;
      violated.push_back(p->name());
      break;
    }
    const absl::StatusOr<PolicyDecision> d = DecideOn(p->limiter(), *key, now, 1, allowed);
    if (!d.ok()) return;  // 400: a key the store refuses
    if (d->allowed) {
      if (allowed) taken.push_back({p, *key, *d});
    } else if (enforce) {
      if (allowed) {
        for (const Taken& t : taken) (void)t.policy->limiter().Refund(t.key, t.decision, 1);
        taken.clear();
      }
      allowed = false;
      violated.push_back(p->name());
      if (d->can_never_pass()) {
        never = true;
      } else if (d->retry_after >= retry) {
        retry = d->retry_after;
        jitter = p->JitterFor(d->limit_index);
      }
    }
    if (enforce) {
      answers.push_back({.name = p->name(), .decision = *d,
                         .window_seconds = p->WindowSeconds(d->limit_index)});
    }
  }
  std::vector<std::pair<std::string, std::string>> headers;
  policy::AppendRateLimitHeaders(answers, /*legacy=*/true, headers);
  if (!allowed) {
    if (!never) (void)policy::RetryAfterSeconds(retry, jitter, f.rng);
    (void)policy::ProblemBody(429, violated, "rate limit exceeded");
  }
}

void DecideCheckBody(std::string_view body) {
  if (std::optional<policy::FlatCheck> flat = policy::ParseFlatCheck(body)) {
    int status = 200;
    ReadBackError(DecideChecked(flat->policy, flat->key, flat->cost, status), status);
    return;
  }
  if (!policy::JsonDepthWithin(body, policy::kMaxJsonDepth)) return;  // 400
  const nlohmann::json json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return;  // 400
  if (json.is_array()) {
    if (json.size() > 1000) return;  // 400
    std::string results = "[";
    for (const nlohmann::json& item : json) {
      if (results.size() > 1) results.push_back(',');
      int status = 200;
      results += DecideOne(item, status);
    }
    results.push_back(']');
    return;
  }
  int status = 200;
  ReadBackError(DecideOne(json, status), status);
}

void InspectKey(std::string_view rest) {
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return;
  const std::optional<std::string> name = policy::PercentDecode(rest.substr(0, slash));
  const std::optional<std::string> key = policy::PercentDecode(rest.substr(slash + 1));
  if (!name || !key) return;
  const Policy* policy = Policies().Find(*name);
  if (policy == nullptr) return;
  policy->limiter().InspectAsync(*key, TheFixture().clock.Now(), 0,
                                 [](absl::StatusOr<std::vector<Decision>>) {});
}

}  // namespace sluice::fuzz
