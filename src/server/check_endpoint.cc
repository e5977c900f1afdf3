// POST /v1/check: the checks of a body (check_api.h), each decided by
// policy::Evaluate on the request's loop.
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/cat.h"
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

// `headers`: whether the RateLimit fields are wanted (a single check's).
Task<Checked> Decide(Context& ctx, const std::variant<CheckItem, CheckError>& check, bool headers) {
  const CheckItem* item = std::get_if<CheckItem>(&check);
  if (item == nullptr) co_return Checked::Failed(std::get<CheckError>(check));
  std::variant<policy::Applied, CheckError> prepared = PrepareCheck(*ctx.set, *item);
  if (const CheckError* e = std::get_if<CheckError>(&prepared)) co_return Checked::Failed(*e);
  const std::vector<policy::Applied> applied = {std::get<policy::Applied>(std::move(prepared))};
  if (item->settle) {
    if (std::optional<std::string> why = UnsettleablePolicy(*applied[0].policy)) {
      co_return Checked::Failed({400, "bad request", *std::move(why)});
    }
  }
  policy::Verdict verdict;
  if (!DecideNow(ctx, applied, verdict)) verdict = co_await DecideTimed(ctx, applied);
  if (!verdict.error.ok()) {
    co_return Checked::Failed({400, "bad request", std::string(verdict.error.message())});
  }
  // A check holds no concurrency slot: it says whether one is free now.
  if (policy::Holds(applied, verdict))
    policy::Release(applied, verdict, ctx.state.clock->Now(), false);
  Checked out{verdict.allowed ? 200 : 429, CheckJson(item->policy, verdict), std::nullopt, {}};
  if (item->settle && verdict.answers[0].took && !verdict.answers[0].refunded) {
    if (std::string reservation = ReservationJson(ctx, applied[0], verdict.answers[0].decision);
        !reservation.empty()) {
      out.json.pop_back();  // the object's '}'
      out.json += reservation;
      out.json.push_back('}');
    }
  }
  if (headers)
    verdict.AppendHeaders(applied, ctx.set->config().server.legacy_headers, ctx.worker.rng,
                          out.headers);
  co_return out;
}

}  // namespace check_endpoint

using check_endpoint::Checked;
using check_endpoint::Decide;

Task<HttpAnswer> CheckEndpoint(Context& ctx, std::string_view method, std::string_view body) {
  if (method != "POST") {
    HttpAnswer answer = HttpAnswer::Problem(405, "method not allowed", "use POST /v1/check");
    answer.headers.emplace_back("Allow", "POST");
    co_return answer;
  }
  std::variant<CheckBody, CheckError> read = ReadCheckBody(body);
  if (const CheckError* e = std::get_if<CheckError>(&read)) {
    co_return HttpAnswer::Problem(e->status, e->title, e->detail);
  }
  const CheckBody& checks = std::get<CheckBody>(read);
  if (!checks.batch) {
    Checked one = co_await Decide(ctx, checks.checks[0], /*headers=*/true);
    // A bad single check: its error as a problem document.
    if (one.error)
      co_return HttpAnswer::Problem(one.error->status, one.error->title, one.error->detail);
    co_return HttpAnswer::Json(one.status, std::move(one.json), std::move(one.headers));
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

}  // namespace sluice::server
