// The gateway (routes:): decide, then forward to the route's upstream.
#ifndef SLUICE_SERVER_GATEWAY_H_
#define SLUICE_SERVER_GATEWAY_H_

#include <string>

#include "server/loop.h"
#include "server/wire.h"

namespace sluice::server {

// The rest of a request whose header is read and whose body has not all
// come. The gateway decides such a request on its header and reads the
// rest only once it is admitted: a request denied (or unrouted) costs its
// header alone, and a client that expects 100-continue is asked for its
// body only then.
class BodyToCome {
 public:
  // Reads the rest of the body (asking a client that expects 100-continue
  // for it first). False when it could not be read: `reply` is then the
  // problem to answer, when there is one (the connection may be gone).
  virtual Task<bool> Read(Reply& reply) = 0;

 protected:
  ~BodyToCome() = default;
};

// Sets `reply` to the answer to `req` from `peer_ip` on the main listener:
// 404 when no route matches, the denial when a policy denies, else the
// upstream's response (502 or 504 when it fails). `req` is rewritten for
// the upstream. With `body`, `req`'s body is still to come: it is read
// only if the request is admitted, after its shaping delay.
Task<void> Gateway(Context& ctx, Request& req, const std::string& peer_ip, Reply& reply,
                   BodyToCome* body = nullptr);

}  // namespace sluice::server

#endif  // SLUICE_SERVER_GATEWAY_H_
