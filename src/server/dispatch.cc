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

// Which endpoint answers a request.
enum class Endpoint {
  kCheck,
  kSettle,
  kLease,
  kAuth,
  kRlsJson,
  kUnauthorized,
  kNotFound,
  kGateway
};

// The endpoint for `req` on `listener`; `path` is set to its target's path.
Endpoint EndpointFor(const Context& ctx, const Request& req, Listener listener,
                     std::string_view& path) {
  const Config& config = ctx.set->config();
  path = TargetPath(req.target());
  const bool lease_path = path == "/v1/acquire" || path == "/v1/renew" || path == "/v1/release";
  const bool decision_path = path == "/v1/check" || lease_path || path == "/v1/settle" ||
                             path == "/v1/auth" || path.substr(0, 9) == "/v1/auth/" ||
                             path == "/json";
  if (decision_path && ServesDecisions(listener, config)) {
    if (!config.server.decision.tokens.empty() &&
        !policy::BearerTokenIn(config.server.decision.tokens, req[http::field::authorization])) {
      return Endpoint::kUnauthorized;
    }
    if (path == "/v1/check") return Endpoint::kCheck;
    if (path == "/v1/settle") return Endpoint::kSettle;
    if (lease_path) return Endpoint::kLease;
    if (path == "/json") return Endpoint::kRlsJson;
    return Endpoint::kAuth;
  }
  if (listener == Listener::kDecision) return Endpoint::kNotFound;
  return Endpoint::kGateway;
}

HttpAnswer Unauthorized() {
  HttpAnswer answer = HttpAnswer::Problem(401, "unauthorized",
                                          "the decision API needs \"Authorization: Bearer "
                                          "<token>\" with a token from server.decision");
  answer.headers.Add("WWW-Authenticate", "Bearer realm=\"sluice\"");
  return answer;
}

HttpAnswer NotFound() {
  return HttpAnswer::Problem(404, "not found",
                             "the decision listener serves POST /v1/check, /v1/settle, "
                             "/v1/acquire, /v1/renew, /v1/release, /v1/auth/{policy} and "
                             "POST /json");
}

// The policy /v1/auth/{policy} names (empty for /v1/auth).
std::string_view AuthPolicy(std::string_view path) {
  return path.size() > 9 ? path.substr(9) : std::string_view();
}

}  // namespace

Answerer AnswererOf(const Context& ctx, const Request& req, Listener listener) {
  std::string_view path;
  switch (EndpointFor(ctx, req, listener, path)) {
    case Endpoint::kGateway:
      return Answerer::kGateway;
    case Endpoint::kUnauthorized:
    case Endpoint::kNotFound:
      return Answerer::kRefusal;
    default:
      return Answerer::kEndpoint;
  }
}

Routed DispatchNow(Context& ctx, Request& req, const std::string& peer_ip, Listener listener,
                   Reply& reply) {
  std::string_view path;
  switch (EndpointFor(ctx, req, listener, path)) {
    case Endpoint::kUnauthorized:
      reply = Unauthorized();
      return Routed::kAnswered;
    case Endpoint::kNotFound:
      reply = NotFound();
      return Routed::kAnswered;
    case Endpoint::kGateway:
      return Routed::kGateway;
    case Endpoint::kCheck:
      if (std::optional<HttpAnswer> now = CheckNow(ctx, req.method_string(), req.body())) {
        reply = *std::move(now);
        return Routed::kAnswered;
      }
      return Routed::kLater;
    case Endpoint::kAuth: {
      std::string path_storage, host;
      RequestFacts facts = AuthFactsOf(req, peer_ip, path_storage, host);
      facts.client_cert = ctx.client_cert;
      if (std::optional<HttpAnswer> now = AuthNow(ctx, facts, AuthPolicy(path), nullptr)) {
        reply = *std::move(now);
        return Routed::kAnswered;
      }
      return Routed::kLater;
    }
    case Endpoint::kSettle:
    case Endpoint::kLease:
    case Endpoint::kRlsJson:
      return Routed::kLater;
  }
  return Routed::kLater;
}

Task<void> Dispatch(Context& ctx, Request& req, const std::string& peer_ip, Listener listener,
                    Reply& reply) {
  std::string_view path;
  HttpAnswer answer;
  switch (EndpointFor(ctx, req, listener, path)) {
    case Endpoint::kUnauthorized:
      answer = Unauthorized();
      break;
    case Endpoint::kNotFound:
      answer = NotFound();
      break;
    case Endpoint::kGateway:
      co_await Gateway(ctx, req, peer_ip, reply);
      co_return;
    case Endpoint::kCheck:
      answer = co_await CheckEndpoint(ctx, req.method_string(), req.body());
      break;
    case Endpoint::kSettle:
      answer = co_await SettleEndpoint(ctx, req.method_string(), req.body());
      break;
    case Endpoint::kLease:
      answer = co_await LeaseEndpoint(ctx, path, req.method_string(), req.body());
      break;
    case Endpoint::kRlsJson:
      answer = co_await RlsJsonEndpoint(ctx, req.method_string(), req.body());
      break;
    case Endpoint::kAuth: {
      std::string path_storage, host;
      RequestFacts facts = AuthFactsOf(req, peer_ip, path_storage, host);
      facts.client_cert = ctx.client_cert;
      std::vector<policy::Applied> applied;
      std::optional<HttpAnswer> now = AuthNow(ctx, facts, AuthPolicy(path), &applied);
      if (now) {
        answer = *std::move(now);
      } else {
        answer = co_await AuthLater(ctx, applied);
      }
      break;
    }
  }
  reply = std::move(answer);
}

}  // namespace sluice::server
