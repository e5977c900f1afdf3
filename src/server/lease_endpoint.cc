// POST /v1/acquire, /v1/renew and /v1/release: concurrency limits for
// callers of the decision API (docs/concurrency.md). An acquire is a check
// whose concurrency slots stay held; its answer carries a lease (a signed
// token, lease_token.h) that renews or releases them.
#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/cat.h"
#include "policy/headers.h"
#include "server/check_api.h"
#include "server/endpoints.h"
#include "server/json_body.h"
#include "server/lease_token.h"

namespace sluice::server {
// (A named namespace: see check_endpoint.cc.)
namespace lease_endpoint {

using internal::Cat;

HttpAnswer Problem(int status, std::string_view title, std::string detail) {
  return HttpAnswer::Problem(status, std::string(title), std::move(detail));
}

// The policy's shortest lease: how long its slots stay held unrenewed;
// `longest`: until when any of them may be.
Duration LeaseTtlOf(const policy::Policy& p, bool longest = false) {
  Duration ttl = longest ? Duration::Zero() : Duration::Infinite();
  for (const LimitConfig& limit : p.limiter().limits()) {
    if (const auto* c = std::get_if<ConcurrencyConfig>(&limit)) {
      ttl = longest ? std::max(ttl, c->lease_ttl()) : std::min(ttl, c->lease_ttl());
    }
  }
  return ttl;
}

// The policy named `name`, if it has a concurrency limit; else the problem.
std::variant<const policy::Policy*, HttpAnswer> LeasingPolicy(const policy::PolicySet& set,
                                                              std::string_view name) {
  const policy::Policy* p = set.Find(name);
  if (p == nullptr) return Problem(404, "unknown policy", Cat("no policy named \"", name, "\""));
  if (!p->has_limiter() || !p->limiter().holds()) {
    return Problem(400, "bad request",
                   Cat("policy \"", name,
                       "\" has no concurrency limit: there is no slot to hold (use /v1/check)"));
  }
  return p;
}

// The token of what `d`, deciding `applied`, took.
LeaseToken TokenOf(LeaseToken::Kind kind, const policy::Applied& applied, const PolicyDecision& d,
                   Time expires = Time()) {
  return {.kind = kind,
          .expires = expires,
          .policy = applied.policy->name(),
          .key = *applied.key,
          .cost = applied.cost,
          .taken_at = d.taken_at,
          .store_time = d.store_time,
          .store_error = d.store_error,
          .slot = kind == LeaseToken::Kind::kLease ? d.slot : 0};
}

// Whether the slots of a lease of `p` are held in this process: a
// concurrency limit in it, or a remote one's on_store_error fallback. Such
// a lease is signed with the process' own secret, so that no other
// instance gives back slots it does not hold.
bool HeldHere(const policy::Policy& p, bool store_error) {
  return p.limiter().holds_here() || store_error;
}

// `,"lease":{"id":...,"expires_in_ms":...}` for `d`, taken by `applied`.
std::string LeaseJson(const ServerState& state, const policy::Applied& applied,
                      const PolicyDecision& d) {
  const LeaseToken token = TokenOf(LeaseToken::Kind::kLease, applied, d);
  const std::string& secret =
      HeldHere(*applied.policy, d.store_error) ? state.own_lease_secret : state.lease_secret;
  std::string out = ",\"lease\":{\"id\":";
  policy::AppendJsonString(out, EncodeLeaseToken(token, secret));
  out += Cat(",\"expires_in_ms\":", LeaseTtlOf(*applied.policy).CeilMillis(), "}");
  return out;
}

// A lease read and verified, and whether the fleet's shared secret signed it.
struct ReadToken {
  LeaseToken token;
  bool shared = false;
};

// The body of a call that carries `what` (a lease, a reservation): a JSON
// object of at most `max_size` bytes with no fields but `fields` (`shape`
// shows it), or the problem to answer.
std::variant<nlohmann::json, HttpAnswer> ReadObject(
    std::string_view body, size_t max_size, std::string_view what, std::string_view shape,
    std::initializer_list<std::string_view> fields) {
  if (body.size() > max_size) {
    return Problem(400, "bad request", Cat("the body is longer than ", what));
  }
  std::optional<std::string> twice;
  nlohmann::json json = ParseJsonBody(body, twice);
  if (twice) return Problem(400, "bad request", Cat("the body names \"", *twice, "\" twice"));
  if (json.is_discarded() || !json.is_object()) {
    return Problem(400, "bad request", Cat("the body must be a JSON object: ", shape));
  }
  for (const auto& [k, v] : json.items()) {
    if (std::find(fields.begin(), fields.end(), k) == fields.end()) {
      return Problem(400, "bad request", Cat("unknown field \"", k, "\" (expected ", shape, ")"));
    }
  }
  return json;
}

// {"lease": "<token>"}: the token, read and verified.
std::variant<ReadToken, HttpAnswer> ReadLease(const ServerState& state, std::string_view body) {
  auto read =
      ReadObject(body, kMaxLeaseTokenLength + 64, "a lease", "{\"lease\": \"...\"}", {"lease"});
  if (auto* problem = std::get_if<HttpAnswer>(&read)) return *std::move(problem);
  const nlohmann::json& json = std::get<nlohmann::json>(read);
  const auto lease = json.find("lease");
  if (lease == json.end() || !lease->is_string()) {
    return Problem(400, "bad request", "\"lease\" (the id /v1/acquire gave) is required");
  }
  if (state.lease_secret.empty()) {
    return Problem(503, "unavailable", "this server has no lease secret");
  }
  const std::string text = lease->get<std::string>();
  ReadToken out;
  absl::StatusOr<LeaseToken> token = DecodeLeaseToken(text, state.own_lease_secret);
  if (!token.ok() && state.lease_secret != state.own_lease_secret) {
    token = DecodeLeaseToken(text, state.lease_secret);
    out.shared = true;
  }
  if (!token.ok()) return Problem(400, "bad request", std::string(token.status().message()));
  if (token->kind != LeaseToken::Kind::kLease) {
    return Problem(400, "bad request", "not a lease (a reservation settles at /v1/settle)");
  }
  out.token = *std::move(token);
  return out;
}

// A renew's or release's lease, read and verified, its policy, and whether
// its longest lease_ttl has passed since it was taken (by the server's
// clock at `now`): its slots are then free, and nothing is given back.
struct LeaseCall {
  LeaseToken lease;
  const policy::Policy* policy = nullptr;
  bool ended = false;
};

std::variant<LeaseCall, HttpAnswer> ReadLeaseCall(const Context& ctx, std::string_view body,
                                                  Time now) {
  std::variant<ReadToken, HttpAnswer> read = ReadLease(ctx.state, body);
  if (HttpAnswer* a = std::get_if<HttpAnswer>(&read)) return std::move(*a);
  ReadToken& token = std::get<ReadToken>(read);
  LeaseCall out{.lease = std::move(token.token)};
  std::variant<const policy::Policy*, HttpAnswer> leasing =
      LeasingPolicy(*ctx.set, out.lease.policy);
  if (HttpAnswer* a = std::get_if<HttpAnswer>(&leasing)) return std::move(*a);
  out.policy = std::get<const policy::Policy*>(leasing);
  if (token.shared && HeldHere(*out.policy, out.lease.store_error)) {
    return Problem(400, "bad request",
                   "a lease whose slots another instance holds: renew or release it there");
  }
  out.ended = now >= out.lease.taken_at + LeaseTtlOf(*out.policy, /*longest=*/true);
  return out;
}

Task<HttpAnswer> Acquire(Context& ctx, std::string_view body) {
  std::variant<CheckBody, CheckError> read = ReadCheckBody(body);
  if (const CheckError* e = std::get_if<CheckError>(&read)) {
    co_return Problem(e->status, e->title, e->detail);
  }
  const CheckBody& checks = std::get<CheckBody>(read);
  if (checks.batch) co_return Problem(400, "bad request", "one acquire per call, not a batch");
  const auto* item = std::get_if<CheckItem>(&checks.checks[0]);
  if (item == nullptr) {
    const CheckError& e = std::get<CheckError>(checks.checks[0]);
    co_return Problem(e.status, e.title, e.detail);
  }
  std::variant<const policy::Policy*, HttpAnswer> leasing = LeasingPolicy(*ctx.set, item->policy);
  if (HttpAnswer* a = std::get_if<HttpAnswer>(&leasing)) co_return std::move(*a);
  if (ctx.state.lease_secret.empty()) {
    co_return Problem(503, "unavailable", "this server has no lease secret");
  }
  std::variant<policy::Applied, CheckError> prepared = PrepareCheck(*ctx.set, *item);
  if (const CheckError* e = std::get_if<CheckError>(&prepared)) {
    co_return Problem(e->status, e->title, e->detail);
  }
  const std::vector<policy::Applied> applied = {std::get<policy::Applied>(std::move(prepared))};
  policy::Verdict verdict;
  if (!DecideNow(ctx, applied, verdict)) verdict = co_await DecideTimed(ctx, applied);
  if (!verdict.error.ok()) {
    co_return Problem(400, "bad request", std::string(verdict.error.message()));
  }
  std::string json = CheckJson(item->policy, verdict);
  if (policy::Holds(applied, verdict)) {
    json.pop_back();  // the object's '}'
    json += LeaseJson(ctx.state, applied[0], verdict.answers[0].decision);
    json.push_back('}');
  }
  HeaderList headers;
  verdict.AppendHeaders(applied, ctx.set->config().server.legacy_headers, ctx.worker.rng, headers);
  co_return HttpAnswer::Json(verdict.allowed ? 200 : 429, std::move(json), std::move(headers));
}

Task<HttpAnswer> Renew(Context& ctx, std::string_view body) {
  const Time now = ctx.state.clock->Now();
  std::variant<LeaseCall, HttpAnswer> read = ReadLeaseCall(ctx, body, now);
  if (HttpAnswer* a = std::get_if<HttpAnswer>(&read)) co_return std::move(*a);
  const LeaseCall& call = std::get<LeaseCall>(read);
  const LeaseToken& lease = call.lease;
  const policy::Policy& p = *call.policy;
  // An ended lease holds nothing: its slots are taken again if they are
  // free. Otherwise the slots of its name are renewed if they are still
  // held (not released, nor run out by the store's clock).
  const PolicyDecision taken = lease.Taken();
  const absl::StatusOr<PolicyDecision> renewed =
      co_await Await<absl::StatusOr<PolicyDecision>>(ctx.worker, [&](DecisionCallback done) {
        if (call.ended) {
          p.limiter().AcquireSlotsAsync(lease.key, now, lease.cost, std::move(done));
        } else {
          p.limiter().RenewAsync(lease.key, now, taken, lease.cost, std::move(done));
        }
      });
  if (!renewed.ok()) {
    const bool store =
        absl::IsUnavailable(renewed.status()) || absl::IsDeadlineExceeded(renewed.status());
    co_return Problem(store ? 503 : 400, store ? "unavailable" : "bad request",
                      std::string(renewed.status().message()));
  }
  if (!renewed->allowed) {
    co_return Problem(409, "lease lost",
                      call.ended ? "the lease had run out and its slot was taken: acquire again"
                                 : "the lease holds no slot any more (it was released, or it ran "
                                   "out): acquire again");
  }
  const policy::Applied applied{.policy = &p, .key = lease.key, .cost = lease.cost};
  std::string json = "{\"renewed\":true";
  json += LeaseJson(ctx.state, applied, *renewed);
  json.push_back('}');
  co_return HttpAnswer::Json(200, std::move(json));
}

Task<HttpAnswer> Release(Context& ctx, std::string_view body) {
  const Time now = ctx.state.clock->Now();
  std::variant<LeaseCall, HttpAnswer> read = ReadLeaseCall(ctx, body, now);
  if (HttpAnswer* a = std::get_if<HttpAnswer>(&read)) co_return std::move(*a);
  const LeaseCall& call = std::get<LeaseCall>(read);
  const LeaseToken& lease = call.lease;
  const policy::Policy& p = *call.policy;
  // An ended lease holds nothing: there is nothing to give back. Otherwise
  // the slots of its name go back if they are still held: released again,
  // a lease gives back nothing, never another request's slot.
  if (call.ended) co_return HttpAnswer::Json(200, "{\"released\":true}");
  if (absl::Status s = p.limiter().Release(lease.key, lease.Taken(), lease.cost); !s.ok()) {
    co_return Problem(400, "bad request", std::string(s.message()));
  }
  // A hold is a sample of the policy's average once (reservations.h).
  if (ctx.state.released_slots.FirstTime(lease.slot)) p.ObserveHold(now - lease.taken_at);
  co_return HttpAnswer::Json(200, "{\"released\":true}");
}

Task<HttpAnswer> Settle(Context& ctx, std::string_view body) {
  auto read = ReadObject(body, kMaxLeaseTokenLength + 128, "a reservation",
                         "{\"reservation\": \"...\", \"cost\": N}", {"reservation", "cost"});
  if (auto* problem = std::get_if<HttpAnswer>(&read)) co_return *std::move(problem);
  const nlohmann::json& json = std::get<nlohmann::json>(read);
  const auto id = json.find("reservation");
  const auto cost = json.find("cost");
  if (id == json.end() || !id->is_string()) {
    co_return Problem(400, "bad request", "\"reservation\" (the id /v1/check gave) is required");
  }
  if (cost == json.end() || !cost->is_number_integer() ||
      (cost->is_number_unsigned() ? cost->get<uint64_t>() > static_cast<uint64_t>(kMaxLimit)
                                  : cost->get<int64_t>() < 0 || cost->get<int64_t>() > kMaxLimit)) {
    co_return Problem(400, "bad request",
                      Cat("\"cost\" (the true cost) must be a whole number from 0 to ", kMaxLimit));
  }
  const std::string text = id->get<std::string>();
  absl::StatusOr<LeaseToken> token = DecodeLeaseToken(text, ctx.state.reservation_secret);
  if (!token.ok()) co_return Problem(400, "bad request", std::string(token.status().message()));
  if (token->kind != LeaseToken::Kind::kReservation) {
    co_return Problem(400, "bad request", "not a reservation (a lease is released at /v1/release)");
  }
  const policy::Policy* p = ctx.set->Find(token->policy);
  if (p == nullptr || !p->has_limiter()) {
    co_return Problem(404, "unknown policy", Cat("no policy named \"", token->policy, "\""));
  }
  // At most once, and before it expires: what was reserved stays the cost.
  if (!ctx.state.reservations.Take(TokenSignature(text), ctx.state.clock->Now())) {
    co_return Problem(409, "reservation closed",
                      "this reservation was settled already, or it expired (its estimate stays "
                      "its cost)");
  }
  if (absl::Status s =
          p->limiter().Settle(token->key, token->Taken(), token->cost, cost->get<int64_t>());
      !s.ok()) {
    co_return Problem(400, "bad request", std::string(s.message()));
  }
  co_return HttpAnswer::Json(200, "{\"settled\":true}");
}

}  // namespace lease_endpoint

std::optional<std::string> UnsettleablePolicy(const policy::Policy& p) {
  if (!p.has_limiter())
    return internal::Cat("policy \"", p.name(), "\" admits nothing: nothing to settle");
  for (const LimitConfig& limit : p.limiter().limits()) {
    if (IsShape(limit) || IsConcurrency(limit) || Charges(limit)) continue;
    return internal::Cat("policy \"", p.name(), "\" has a ", AlgorithmName(AlgorithmOf(limit)),
                         " limit, which cannot carry debt; settled costs need token_bucket, gcra, "
                         "fixed_window or sliding_window");
  }
  return std::nullopt;
}

std::string ReservationJson(Context& ctx, const policy::Applied& applied,
                            const PolicyDecision& taken) {
  const Time now = ctx.state.clock->Now();
  const LeaseToken token = lease_endpoint::TokenOf(LeaseToken::Kind::kReservation, applied, taken,
                                                   now + kReservationTtl);
  const std::string id = EncodeLeaseToken(token, ctx.state.reservation_secret);
  ctx.state.reservations.Add(TokenSignature(id), token.expires, now);
  std::string out = ",\"reservation\":{\"id\":";
  policy::AppendJsonString(out, id);
  out += internal::Cat(",\"expires_in_ms\":", kReservationTtl.CeilMillis(), "}");
  return out;
}

Task<HttpAnswer> SettleEndpoint(Context& ctx, std::string_view method, std::string_view body) {
  if (method != "POST") {
    HttpAnswer answer = HttpAnswer::Problem(405, "method not allowed", "use POST /v1/settle");
    answer.headers.Add("Allow", "POST");
    co_return answer;
  }
  co_return co_await lease_endpoint::Settle(ctx, body);
}

Task<HttpAnswer> LeaseEndpoint(Context& ctx, std::string_view path, std::string_view method,
                               std::string_view body) {
  if (method != "POST") {
    HttpAnswer answer =
        HttpAnswer::Problem(405, "method not allowed", internal::Cat("use POST ", path));
    answer.headers.Add("Allow", "POST");
    co_return answer;
  }
  if (path == "/v1/acquire") co_return co_await lease_endpoint::Acquire(ctx, body);
  if (path == "/v1/renew") co_return co_await lease_endpoint::Renew(ctx, body);
  co_return co_await lease_endpoint::Release(ctx, body);
}

}  // namespace sluice::server
