// GET /v1/auth[/{policy}]: NGINX auth_request. The original request's
// facts (X-Original-*) are read by the transport; the policies decide them
// through policy::Evaluate.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "base/cat.h"
#include "policy/headers.h"
#include "server/endpoints.h"

namespace sluice::server {

namespace {

// The answer to an auth request decided by `verdict`.
HttpAnswer AuthAnswer(Context& ctx, const std::vector<policy::Applied>& applied,
                      const policy::Verdict& verdict) {
  if (!verdict.error.ok()) {
    return HttpAnswer::Problem(400, "bad request", std::string(verdict.error.message()));
  }
  // NGINX never says when the request it asked about ends: a concurrency
  // limit here admits when a slot is free now and holds none.
  if (policy::Holds(applied, verdict))
    policy::Release(applied, verdict, ctx.state.clock->Now(), false);
  HttpAnswer answer;
  answer.status = 204;
  verdict.AppendHeaders(applied, ctx.set->config().server.legacy_headers, ctx.worker.rng,
                        answer.headers);
  // 2xx lets NGINX forward the request; 403 (mapped to 429 by
  // `error_page 403 =429`) carries Retry-After and the RateLimit fields.
  if (!verdict.allowed) {
    answer.status = 403;
    answer.content_type = "application/problem+json";
    answer.body = policy::ProblemBody(429, verdict.violated, verdict.detail);
  }
  return answer;
}

}  // namespace

std::optional<HttpAnswer> AuthNow(Context& ctx, const policy::RequestFacts& facts,
                                  std::string_view policy, std::vector<policy::Applied>* later) {
  const policy::PolicySet& set = *ctx.set;
  policy::PolicyList applying;
  if (!policy.empty()) {
    const policy::Policy* p = set.Find(policy);
    if (p == nullptr) {
      return HttpAnswer::Problem(404, "unknown policy",
                                 internal::Cat("no policy named \"", policy, "\""));
    }
    applying.push_back(p);
  } else {
    applying = set.Matching(facts);
  }
  const bool in_process = std::all_of(applying.begin(), applying.end(),
                                      [](const policy::Policy* p) { return p->in_process(); });
  if (!in_process && later == nullptr) return std::nullopt;  // no keys made for nothing
  AppliedNow local(ctx.worker);
  std::vector<policy::Applied>& applied = later != nullptr ? *later : local.list();
  ApplyPolicies(ctx, applying, facts, "", applied);
  policy::Verdict verdict;
  if (!DecideNow(ctx, applied, verdict)) return std::nullopt;
  return AuthAnswer(ctx, applied, verdict);
}

Task<HttpAnswer> AuthLater(Context& ctx, const std::vector<policy::Applied>& applied) {
  const policy::Verdict verdict = co_await DecideTimed(ctx, applied);
  co_return AuthAnswer(ctx, applied, verdict);
}

}  // namespace sluice::server
