// The gateway (routes:): decide, then forward to the route's upstream.
#ifndef SLUICE_SERVER_GATEWAY_H_
#define SLUICE_SERVER_GATEWAY_H_

#include <string>

#include "server/loop.h"
#include "server/wire.h"

namespace sluice::server {

// Sets `reply` to the answer to `req` from `peer_ip` on the main listener:
// 404 when no route matches, the denial when a policy denies, else the
// upstream's response (502 or 504 when it fails). `req` is rewritten for
// the upstream.
Task<void> Gateway(Context& ctx, Request& req, const std::string& peer_ip, Reply& reply);

}  // namespace sluice::server

#endif  // SLUICE_SERVER_GATEWAY_H_
