// Dispatch: which endpoint answers a request on the main or decision
// listener: the decision API (/v1/check, /v1/auth) where it is served
// (server.decision), with its token check, else the gateway.
#ifndef SLUICE_SERVER_DISPATCH_H_
#define SLUICE_SERVER_DISPATCH_H_

#include <string>
#include <string_view>

#include "server/loop.h"
#include "server/wire.h"

namespace sluice::server {

// Which listener a connection came in on. The decision API spends any
// key's quota, so where it is served is the operator's choice (see
// DecisionConfig); the admin listener answers only GETs.
enum class Listener { kGateway, kDecision, kAdmin };
inline constexpr int kListeners = 3;
inline constexpr std::string_view kListenerNames[kListeners] = {"main", "decision", "admin"};

// What DispatchNow did with a request.
enum class Routed {
  kAnswered,  // `reply` holds the answer
  kGateway,   // for the gateway: Gateway (gateway.h) answers it
  kLater,     // it waits on something (Redis, a body of checks): Dispatch answers it
};

// Who answers `req` on `listener`, as its header says.
enum class Answerer {
  kGateway,   // the gateway
  kRefusal,   // a refusal that reads nothing more (401 for a missing token, 404)
  kEndpoint,  // an endpoint of the decision API, which reads the body
};
Answerer AnswererOf(const Context& ctx, const Request& req, Listener listener);

// Answers into `reply` what needs no wait, without a coroutine frame of its
// own (a frame nested below the session's is a malloc and a free): the
// decision API's checks and auth requests of policies in this process, and
// what it refuses. Decides nothing when it says kGateway or kLater.
Routed DispatchNow(Context& ctx, Request& req, const std::string& peer_ip, Listener listener,
                   Reply& reply);

// Sets `reply` to the answer to `req`, from `peer_ip` on `listener`, any
// request (written where the session keeps it, not moved out through each
// coroutine's result).
Task<void> Dispatch(Context& ctx, Request& req, const std::string& peer_ip, Listener listener,
                    Reply& reply);

}  // namespace sluice::server

#endif  // SLUICE_SERVER_DISPATCH_H_
