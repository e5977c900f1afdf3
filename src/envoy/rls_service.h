// The rate limit service's handler without gRPC's server around it: the
// generated service with its one method, ShouldRateLimit, on the rules of a
// snapshot. RlsServer answers its calls on completion queues with the same
// handling; the fuzz target (fuzz/rls_request.cc) calls this form with
// requests parsed from its input.
// Includes the gRPC and protobuf headers: only the files that need the
// service itself include this.
#ifndef SLUICE_ENVOY_RLS_SERVICE_H_
#define SLUICE_ENVOY_RLS_SERVICE_H_

#include <memory>

#include "envoy/rls_server.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "metrics/metrics.h"
#include "policy/envoy_rules.h"
#include "tls/context.h"

namespace sluice::envoy {

struct RlsServer::Snapshot {
  std::shared_ptr<const policy::RuleSet> rules;
  bool legacy_headers = false;  // server.legacy_headers
  bool shadow = false;          // envoy_shadow_mode
  // envoy_limit_headers: envoyproxy/ratelimit's three limit headers.
  std::optional<EnvoyLimitHeaders> response_limit_headers, request_limit_headers;
  std::optional<RlqsConfig> rlqs;  // the quota service's rules
  // grpc.tls's context, its files read for this snapshot (null: no TLS).
  std::shared_ptr<tls::Context> tls;
};

// The service on `snapshot`'s rules, counting its calls in `metrics`.
// ShouldRateLimit returns the call's reactor; a call whose limits are all in
// process is answered before it returns. gRPC calls the reactor's OnDone
// once the answer is sent (without gRPC, the caller does), which frees it.
std::unique_ptr<::envoy::service::ratelimit::v3::RateLimitService::CallbackService> MakeService(
    const policy::RuleOptions& options, metrics::Metrics& metrics,
    std::shared_ptr<const RlsServer::Snapshot> snapshot);

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_RLS_SERVICE_H_
