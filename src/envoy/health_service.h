// grpc.health.v1.Health on the gRPC listener, as envoyproxy/ratelimit
// serves it: Kubernetes' gRPC probes, Envoy's gRPC health checker and
// grpc_health_probe ask it whether this instance takes calls. Internal to
// the Envoy rate limit service (rls_server.cc registers it).
//
// Check answers SERVING while `ready` says so (sluice serve: not draining,
// and the shared store reachable: the admin listener's /readyz), else
// NOT_SERVING, for the whole server ("") and for each name in `names`
// (envoyproxy/ratelimit's "ratelimit", the services served); any other
// name is NOT_FOUND, as the protocol says. Watch sends the status at once,
// then each change, looked at every second by a thread of the service's
// (SERVICE_UNKNOWN for another name, the stream kept open); LookNow at the
// server's shutdown sends NOT_SERVING before the shutdown cancels them.
//
// Includes the gRPC and protobuf headers: only rls_server.cc includes it.
//
// Thread-safety: calls on any of gRPC's threads; `ready` is called on them
// and on the service's thread.
#ifndef SLUICE_ENVOY_HEALTH_SERVICE_H_
#define SLUICE_ENVOY_HEALTH_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"

namespace sluice::envoy {

class HealthService : public ::grpc::health::v1::Health::CallbackService {
 public:
  // Looks at `ready` now, not at the next second, and tells the watchers
  // what changed (a shutdown: NOT_SERVING before their streams end).
  virtual void LookNow() = 0;
};

std::unique_ptr<HealthService> MakeHealthService(std::function<bool()> ready,
                                                 std::vector<std::string> names);

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_HEALTH_SERVICE_H_
