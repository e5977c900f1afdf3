// Server: `sluice serve`. Internal; apps/sluice/main.cc is its only user.
// The parts, each in its own file: the transport (server.cc), the config
// source (config_source.h), the endpoints that answer values (endpoints.h:
// the decision API, auth_request, admin), the gateway (gateway.h); the
// Envoy rate limit service is a sibling (src/envoy/).
//
// HTTP/1.1 on Boost.Beast, one event loop (io_context) per thread, each on a
// CPU of its own, accepting the connections made from that CPU
// (server.cpu_affinity; setup.h, Listen), and a request is handled start to
// finish on one thread. The
// admin listener runs on the first loop. Nothing blocks a loop: limits are
// decided in memory, upstream I/O and shaping delays are asynchronous.
//
// Thread-safety: Create and Run from one thread; Reload and Stop from any.
#ifndef SLUICE_SERVER_SERVER_H_
#define SLUICE_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/config_source.h"
#include "server/lifecycle.h"
#include "sluice/clock.h"
#include "sluice/config.h"

namespace sluice::server {

struct ServerOptions {
  // Default: SystemClock::Default().
  const Clock* clock = nullptr;
  // Told when the server is ready, reloading, stopping (lifecycle.h).
  // Default: nobody.
  LifecycleHook lifecycle;
};

class Server {
 public:
  // Binds the listeners for `source`'s config; nothing is served until
  // Run, which subscribes to the source for new configs (SIGHUP, a changed
  // file) and starts it. `source` must outlive the server.
  static absl::StatusOr<std::unique_ptr<Server>> Create(ConfigSource& source,
                                                        ServerOptions options = {});
  virtual ~Server() = default;

  // Serves until SIGTERM/SIGINT (or Stop), drains in-flight requests within
  // server.drain_timeout, and returns. Tells options.lifecycle kReady once
  // its loops run, kReloading and kReady around each reload, kStopping when
  // the drain begins.
  virtual absl::Status Run() = 0;
  virtual void Stop() = 0;

  virtual uint16_t port() const = 0;
  virtual uint16_t admin_port() const = 0;
  // server.decision.listen's port; 0 when it has no listener of its own.
  virtual uint16_t decision_port() const = 0;
};

}  // namespace sluice::server

#endif  // SLUICE_SERVER_SERVER_H_
