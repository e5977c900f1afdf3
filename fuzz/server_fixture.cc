#include "server_fixture.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "base/cat.h"
#include "metrics/metrics.h"
#include "nlohmann/json.hpp"
#include "policy/evaluation.h"
#include "policy/headers.h"
#include "policy/request_text.h"
#include "server/check_api.h"
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

// Matched on method, path (a script's too), path prefix, host and header; keyed on
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
  - name: live
    match: {path_prefix: /live/}
    upstream: http://127.0.0.1:3002
    websocket: true
  - name: app
    match: {path_prefix: /}
    upstream: http://127.0.0.1:3000
policies:
  - name: login
    match: {path: /login, method: POST}
    key: [client_ip]
    limits: [{algorithm: sliding_log, rate: 3/min}]
  - name: wp-login
    match: {path: /blog/wp-login.php}
    key: [client_ip]
    limits: [{algorithm: fixed_window, rate: 5/min}]
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
  - name: account
    match: {path_prefix: /account, method: DELETE}
    key: [client_ip]
    limits: [{algorithm: gcra, rate: 1/min}]
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

// What the decision API writes must be JSON, whatever a check held (the
// policy's name and the key are the client's text, escaped).
void MustBeJson(const std::string& text) {
  if (!nlohmann::json::accept(text)) __builtin_trap();
}

// What goes in a response's head must be fields and nothing else: no CR, LF
// or NUL inside a name or a value (a field or a response of its own), and
// the wire text exactly the fields read back.
void MustBeFields(const policy::FieldList& fields) {
  std::string wire;
  for (const auto& [name, value] : fields) {
    for (const std::string_view part : {name, value}) {
      if (part.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos) {
        __builtin_trap();
      }
    }
    wire += Cat(name, ": ", value, "\r\n");
  }
  if (wire != fields.wire()) __builtin_trap();
}

// check_endpoint.cc's Decide: one check of a body, read by check_api.
void DecideCheck(const std::variant<server::CheckItem, server::CheckError>& check, bool headers) {
  Fixture& f = TheFixture();
  const auto* item = std::get_if<server::CheckItem>(&check);
  if (item == nullptr) {
    MustBeJson(server::CheckErrorJson(std::get<server::CheckError>(check)));
    return;
  }
  std::variant<policy::Applied, server::CheckError> prepared =
      server::PrepareCheck(*f.policies, *item);
  if (const auto* e = std::get_if<server::CheckError>(&prepared)) {
    MustBeJson(server::CheckErrorJson(*e));
    return;
  }
  const std::vector<policy::Applied> applied = {std::get<policy::Applied>(std::move(prepared))};
  const policy::Verdict verdict = policy::EvaluateNow(applied, f.clock.Now());
  if (!verdict.error.ok()) return;  // 400
  MustBeJson(server::CheckJson(item->policy, verdict));
  policy::FieldList out;
  if (headers) verdict.AppendHeaders(applied, /*legacy=*/true, f.rng, out);
  MustBeFields(out);
}

}  // namespace

const PolicySet& Policies(RealIp real_ip) {
  Fixture& f = TheFixture();
  return real_ip == RealIp::kForwarded ? *f.forwarded_policies : *f.policies;
}

void DecideRequest(const PolicySet& set, absl::Span<const Policy* const> applying,
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
  std::vector<policy::Applied> applied;
  for (const Policy* p : applying) {
    applied.push_back(
        {.policy = p, .key = p->KeyFor(facts, route, trusted, set.config().real_ip_header)});
  }
  const policy::Verdict verdict = policy::EvaluateNow(applied, now);
  if (!verdict.error.ok()) return;  // 400: a key the store refuses
  policy::FieldList headers;
  verdict.AppendHeaders(applied, /*legacy=*/true, f.rng, headers);
  MustBeFields(headers);
  if (!verdict.allowed) (void)policy::ProblemBody(verdict.status, verdict.violated, verdict.detail);
}

void DecideCheckBody(std::string_view body) {
  std::variant<server::CheckBody, server::CheckError> read = server::ReadCheckBody(body);
  if (std::holds_alternative<server::CheckError>(read)) return;  // a problem document
  const server::CheckBody& checks = std::get<server::CheckBody>(read);
  for (const auto& check : checks.checks) DecideCheck(check, /*headers=*/!checks.batch);
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
