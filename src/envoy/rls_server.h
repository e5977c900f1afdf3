// RlsServer: the Envoy rate limit service (RLS v3),
// `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC
// on a listener of its own (`grpc.listen`), deciding with the envoy rules
// of the config (`envoy:`, `envoy_files:`). Internal to `sluice serve`.
//
// This header stays free of gRPC and protobuf headers, which are slow to
// compile: the service, the server and the generated code live in
// rls_server.cc and the proto library only.
//
// The same listener serves gRPC's health service (grpc.health.v1.Health,
// health_service.h) and, with `rlqs:`, Envoy's quota service.
//
// The listener bounds what clients can hold (grpc.max_connections,
// handshake_timeout, idle_timeout, max_connection_age): sluice accepts the
// connections itself and hands them to gRPC, which has no cap of its own.
//
// Calls come to gRPC completion queues, one per thread (server.threads),
// each polled by a thread of the server's own. A decision by in-process
// limits is answered on that thread; one that waits for a remote store
// (Redis, Limiter::AcquireAsync answering on the store's thread) finishes
// the call from that thread, so no thread ever blocks. What a queue's thread
// asks a remote store while its queue has calls ready is one turn
// (sluice/store/store.h, LoopTurn): those decisions go to Redis together.
// (The service's callback form, MakeService in rls_service.h, decides the
// same way; the fuzz target calls it in process.)
//
// Thread-safety: Prepare, Swap, Shutdown from any thread; Wait from one.
//
//   auto rls = RlsServer::Start(config, {.local = &store, .clock = &clock, .metrics = &metrics});
//   ...                                  // on reload:
//   auto next = (*rls)->Prepare(new_config);
//   if (next.ok()) (*rls)->Swap(*next);
//   (*rls)->Shutdown(Duration::Seconds(10));  // on SIGTERM
//   (*rls)->Wait();
#ifndef SLUICE_ENVOY_RLS_SERVER_H_
#define SLUICE_ENVOY_RLS_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "envoy/quota_book.h"
#include "policy/envoy_rules.h"
#include "sluice/config.h"
#include "sluice/time.h"

namespace sluice::envoy {

class RlsServer {
 public:
  // The rules and settings of one config, built and not yet in force.
  struct Snapshot;

  // Builds the rules of `config` and listens on config.grpc->listen
  // (which must be set), with the connection limits of config.grpc.
  // `options` (stores, clock, metrics) must outlive the server. The gRPC
  // health service (health_service.h) answers SERVING while `ready` (when
  // given) says so and Shutdown has not been called.
  static absl::StatusOr<std::unique_ptr<RlsServer>> Start(const Config& config,
                                                          const policy::RuleOptions& options,
                                                          std::function<bool()> ready = {});
  // Shuts down at once if Shutdown was not called, and waits.
  virtual ~RlsServer() = default;

  // Builds the rules of `config` for a reload: rules whose place and limit
  // did not change keep their state. Nothing changes until Swap. Changes
  // to config.grpc take effect at the next start.
  virtual absl::StatusOr<std::shared_ptr<const Snapshot>> Prepare(const Config& config) const = 0;
  virtual void Swap(std::shared_ptr<const Snapshot> next) = 0;

  // Stops taking new calls at once and returns; calls in flight may finish
  // within `within`, then they are cancelled.
  virtual void Shutdown(Duration within) = 0;
  // Returns when the shutdown is complete.
  virtual void Wait() = 0;

  virtual uint16_t port() const = 0;

  // envoyproxy/ratelimit's POST /json: a RateLimitRequest in JSON
  // (protobuf's JSON form, field names as written or in lowerCamelCase),
  // decided as ShouldRateLimit decides it. `done` gets the answer, at once
  // when every limit is in process, else on the store's thread: 200 with
  // the RateLimitResponse in JSON (lowerCamelCase, enums by name), 429 with
  // it when OVER_LIMIT, 500 with it when UNKNOWN, or 400 with the reason
  // (in words) when the body is not a valid request.
  struct JsonAnswer {
    int status = 0;
    std::string body;
  };
  virtual void DecideJson(std::string_view body, std::function<void(JsonAnswer)> done) = 0;

  // The quota service's buckets (rlqs:), and what each is assigned.
  virtual std::vector<QuotaBook::BucketView> QuotaBuckets() const = 0;
};

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_RLS_SERVER_H_
