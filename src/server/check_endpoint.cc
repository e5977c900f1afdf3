// POST /v1/check: the checks of a body (check_api.h), each decided by
// policy::Evaluate on the request's loop.
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/cat.h"
#include "policy/request_text.h"
#include "server/check_api.h"
#include "server/endpoints.h"

namespace sluice::server {
// (A named namespace: the endpoint's coroutine frame holds these, and GCC
// warns about a frame of a function with linkage holding a type without.)
namespace check_endpoint {

// One check: its verdict's JSON object and status, or its error.
struct Checked {
  int status = 200;
  std::string json;
  std::optional<CheckError> error;
  HeaderList headers;

  static Checked Failed(CheckError e) { return {e.status, {}, std::move(e), {}}; }
};

// Reads `check` into `applied`: true; false with its error in `failed`.
bool Prepare(Context& ctx, const std::variant<CheckItem, CheckError>& check,
             std::vector<policy::Applied>& applied, Checked& failed) {
  const CheckItem* item = std::get_if<CheckItem>(&check);
  if (item == nullptr) {
    failed = Checked::Failed(std::get<CheckError>(check));
    return false;
  }
  std::variant<policy::Applied, CheckError> prepared = PrepareCheck(*ctx.set, *item);
  if (const CheckError* e = std::get_if<CheckError>(&prepared)) {
    failed = Checked::Failed(*e);
    return false;
  }
  applied.push_back(std::get<policy::Applied>(std::move(prepared)));
  if (item->settle) {
    if (std::optional<std::string> why = UnsettleablePolicy(*applied[0].policy)) {
      failed = Checked::Failed({400, "bad request", *std::move(why)});
      return false;
    }
  }
  return true;
}

// The answer to `item`, decided by `verdict`. `headers`: whether the
// RateLimit fields are wanted (a single check's).
Checked Answer(Context& ctx, const CheckItem& item, const std::vector<policy::Applied>& applied,
               const policy::Verdict& verdict, bool headers) {
  if (!verdict.error.ok()) {
    return Checked::Failed({400, "bad request", std::string(verdict.error.message())});
  }
  // A check holds no concurrency slot: it says whether one is free now.
  if (policy::Holds(applied, verdict))
    policy::Release(applied, verdict, ctx.state.clock->Now(), false);
  Checked out{verdict.allowed ? 200 : 429, CheckJson(item.policy, verdict), std::nullopt, {}};
  if (item.settle && verdict.answers[0].took && !verdict.answers[0].refunded) {
    out.json.pop_back();  // the object's '}'
    out.json += ReservationJson(ctx, applied[0], verdict.answers[0].decision);
    out.json.push_back('}');
  }
  if (headers)
    verdict.AppendHeaders(applied, ctx.set->config().server.legacy_headers, ctx.worker.rng,
                          out.headers);
  return out;
}

// One check of a batch, or a single one whose policy is in Redis.
Task<Checked> Decide(Context& ctx, const std::variant<CheckItem, CheckError>& check, bool headers) {
  std::vector<policy::Applied> applied;
  Checked failed;
  if (!Prepare(ctx, check, applied, failed)) co_return failed;
  policy::Verdict verdict;
  if (!DecideNow(ctx, applied, verdict)) verdict = co_await DecideTimed(ctx, applied);
  co_return Answer(ctx, std::get<CheckItem>(check), applied, verdict, headers);
}

// A single check's answer: its verdict's JSON, or its error as a problem
// document.
HttpAnswer Single(Checked one) {
  if (one.error) return HttpAnswer::Problem(one.error->status, one.error->title, one.error->detail);
  return HttpAnswer::Json(one.status, std::move(one.json), std::move(one.headers));
}

// What the endpoint answers before deciding anything: 405 for another
// method, or the problem with the body; nullopt for a body of checks.
std::optional<HttpAnswer> Refused(std::string_view method,
                                  const std::variant<CheckBody, CheckError>& read) {
  if (method != "POST") {
    HttpAnswer answer = HttpAnswer::Problem(405, "method not allowed", "use POST /v1/check");
    answer.headers.Add("Allow", "POST");
    return answer;
  }
  if (const CheckError* e = std::get_if<CheckError>(&read)) {
    return HttpAnswer::Problem(e->status, e->title, e->detail);
  }
  return std::nullopt;
}

}  // namespace check_endpoint

using check_endpoint::Checked;
using check_endpoint::Decide;

namespace check_endpoint {

// One check answered at once when its policy is in this process; nullopt,
// having decided nothing, when it is in Redis.
std::optional<HttpAnswer> SingleNow(Context& ctx,
                                    const std::variant<CheckItem, CheckError>& check) {
  AppliedNow now(ctx.worker);
  std::vector<policy::Applied>& applied = now.list();
  Checked one;
  if (!Prepare(ctx, check, applied, one)) return Single(std::move(one));
  policy::Verdict verdict;
  if (!DecideNow(ctx, applied, verdict)) return std::nullopt;
  return Single(Answer(ctx, std::get<CheckItem>(check), applied, verdict, /*headers=*/true));
}

}  // namespace check_endpoint

std::optional<HttpAnswer> CheckNow(Context& ctx, std::string_view method, std::string_view body) {
  if (method != "POST") return std::nullopt;
  // The common shape (one flat object of strings and a cost), read without
  // a body of checks to hold it; any other body is read once, by
  // CheckEndpoint.
  const std::optional<policy::FlatCheck> flat = policy::ParseFlatCheck(body);
  if (!flat) return std::nullopt;
  return check_endpoint::SingleNow(
      ctx, CheckItem{std::string(flat->policy), std::string(flat->key), flat->cost});
}

Task<HttpAnswer> CheckEndpoint(Context& ctx, std::string_view method, std::string_view body) {
  const std::variant<CheckBody, CheckError> read = ReadCheckBody(body);
  if (std::optional<HttpAnswer> refused = check_endpoint::Refused(method, read)) {
    co_return *std::move(refused);
  }
  const CheckBody& checks = std::get<CheckBody>(read);
  if (!checks.batch) {
    Checked one = co_await Decide(ctx, checks.checks[0], /*headers=*/true);
    co_return check_endpoint::Single(std::move(one));
  }
  std::string results = "[";
  for (const auto& check : checks.checks) {
    if (results.size() > 1) results.push_back(',');
    Checked one = co_await Decide(ctx, check, /*headers=*/false);
    results += one.error ? CheckErrorJson(*one.error) : one.json;
  }
  results.push_back(']');
  co_return HttpAnswer::Json(200, std::move(results));
}

Task<HttpAnswer> RlsJsonEndpoint(Context& ctx, std::string_view method, std::string_view body) {
  if (method != "POST") {
    HttpAnswer answer = HttpAnswer::Problem(405, "method not allowed", "use POST /json");
    answer.headers.Add("Allow", "POST");
    co_return answer;
  }
  envoy::RlsServer* rls = ctx.state.rls.get();
  if (rls == nullptr) {
    co_return HttpAnswer::Problem(404, "not found",
                                  "/json decides by the envoy rules, which are served with "
                                  "grpc.listen: set grpc");
  }
  envoy::RlsServer::JsonAnswer answer = co_await Await<envoy::RlsServer::JsonAnswer>(
      ctx.worker, [rls, body](auto done) { rls->DecideJson(body, std::move(done)); });
  if (answer.status == 400) co_return HttpAnswer::Problem(400, "bad request", answer.body);
  co_return HttpAnswer::Json(answer.status, std::move(answer.body));
}

}  // namespace sluice::server
