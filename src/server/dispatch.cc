// Which endpoint answers a request on the main or decision listener.
#include "server/dispatch.h"

#include "policy/request_text.h"
#include "server/endpoints.h"
#include "server/gateway.h"

namespace sluice::server {
namespace {

using policy::RequestFacts;

// Whether `listener` serves the decision API under `config` (see
// DecisionConfig): routes can come and go with a reload.
bool ServesDecisions(Listener listener, const Config& config) {
  if (listener == Listener::kDecision) return true;
  const DecisionConfig& dc = config.server.decision;
  return listener == Listener::kGateway && !dc.listen &&
         (config.routes.empty() || dc.on_gateway_listener);
}

}  // namespace

Task<void> Dispatch(Context& ctx, Request& req, const std::string& peer_ip, Listener listener,
                    Reply& reply) {
  const Config& config = ctx.set->config();
  const std::string_view path = TargetPath(View(req.target()));
  const bool lease_path = path == "/v1/acquire" || path == "/v1/renew" || path == "/v1/release";
  const bool decision_path = path == "/v1/check" || lease_path || path == "/v1/settle" ||
                             path == "/v1/auth" || path.substr(0, 9) == "/v1/auth/";
  HttpAnswer answer;
  if (decision_path && ServesDecisions(listener, config)) {
    if (!config.server.decision.tokens.empty() &&
        !policy::BearerTokenIn(config.server.decision.tokens,
                               View(req[http::field::authorization]))) {
      answer = HttpAnswer::Problem(401, "unauthorized",
                                   "the decision API needs \"Authorization: Bearer <token>\" "
                                   "with a token from server.decision");
      answer.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"sluice\"");
    } else if (path == "/v1/check") {
      std::optional<HttpAnswer> now = CheckNow(ctx, View(req.method_string()), req.body());
      if (now) {
        answer = *std::move(now);
      } else {
        answer = co_await CheckEndpoint(ctx, View(req.method_string()), req.body());
      }
    } else if (path == "/v1/settle") {
      answer = co_await SettleEndpoint(ctx, View(req.method_string()), req.body());
    } else if (lease_path) {
      answer = co_await LeaseEndpoint(ctx, path, View(req.method_string()), req.body());
    } else {
      std::string path_storage, host;
      const RequestFacts facts = AuthFactsOf(req, peer_ip, path_storage, host);
      // (Not a ?: among the arguments: g++ 12 miscompiles a conditional
      // expression in a co_await's operand.)
      std::string_view policy;
      if (path.size() > 9) policy = path.substr(9);
      std::vector<policy::Applied> applied;
      std::optional<HttpAnswer> now = AuthNow(ctx, facts, policy, applied);
      if (now) {
        answer = *std::move(now);
      } else {
        answer = co_await AuthLater(ctx, applied);
      }
    }
    reply = std::move(answer);
    co_return;
  }
  if (listener == Listener::kDecision) {
    reply = HttpAnswer::Problem(404, "not found",
                                "the decision listener serves POST /v1/check, /v1/settle, "
                                "/v1/acquire, /v1/renew, /v1/release and /v1/auth/{policy}");
    co_return;
  }
  co_await Gateway(ctx, req, peer_ip, reply);
}

}  // namespace sluice::server
