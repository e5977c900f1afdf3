// The gateway (routes:): decide, then forward to the route's upstream.
#ifndef SLUICE_SERVER_GATEWAY_H_
#define SLUICE_SERVER_GATEWAY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "server/loop.h"
#include "server/wire.h"

namespace sluice::server {

// A request body said to be this long or shorter is read whole before it
// goes to the upstream; a longer one, or a chunked one, goes as it comes.
inline constexpr uint64_t kWholeRequestBodyBytes = 1 << 20;

// The rest of a request whose header is read and whose body has not all
// come. The gateway decides such a request on its header and reads the
// rest only once it is admitted: a request denied (or unrouted) costs its
// header alone, and a client that expects 100-continue is asked for its
// body only then.
class BodyToCome {
 public:
  // Reads the rest of the body (asking a client that expects 100-continue
  // for it first), `most` bytes at most in all (a 413 beyond). False when
  // it could not be read: `reply` is then the problem to answer, when
  // there is one (the connection may be gone).
  virtual Task<bool> Read(Reply& reply, int64_t most) = 0;
  // Whether the body is one to stream rather than read whole: chunked, or
  // said to be longer than kWholeRequestBodyBytes.
  virtual bool Streams() = 0;
  // The length the client said, if it said one.
  virtual std::optional<uint64_t> Length() = 0;
  // The next part of the body as it comes, into `part` (asking a client
  // that expects 100-continue for it first); `end` once the last has come.
  // Each wait for the client has server.read_timeout, and with a floor on
  // its rate (SetMinRate) the body as a whole the time that floor allows.
  // False as for Read.
  virtual Task<bool> ReadPart(std::string& part, bool& end, Reply& reply) = 0;
  // For the ReadPart calls to come: the client must send at least
  // `bytes_a_second` on average over the time its parts were waited for,
  // after a grace of server.read_timeout (routes[].min_upload_rate; 0: no
  // floor).
  // A client slower than that is cut off as one whose wait ran out.
  virtual void SetMinRate(int64_t bytes_a_second) = 0;
  // Whether the reading was cut off for being slower than the floor.
  virtual bool TooSlow() const = 0;

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
