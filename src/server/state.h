// ServerState: what every part of `sluice serve` shares: the config it
// started with, the stores, the metrics, the policies in force and whether
// it is draining. Free of Beast and Asio.
//
// Thread-safety: the policies are swapped atomically (Publish); the rest is
// set up before serving starts and read-only after, or thread-safe itself.
#ifndef SLUICE_SERVER_STATE_H_
#define SLUICE_SERVER_STATE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "envoy/rls_server.h"
#include "metrics/metrics.h"
#include "policy/policy_set.h"
#include "server/config_source.h"
#include "server/lease_token.h"
#include "server/reservations.h"
#include "server/series.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/store/memory_store.h"
#include "sluice/store/redis_store.h"
#include "tls/context.h"

namespace sluice::server {

struct ServerState {
  ServerState(Config c, const Clock* clk)
      : config(std::move(c)),
        clock(clk),
        store(MemoryStoreOptions{.max_keys = config.store.max_keys,
                                 .on_full = config.store.on_full}) {}

  // Why this instance should not be sent traffic now, "" when it should:
  // it is draining, or the shared store is unreachable (decisions then
  // follow on_store_error, and a balancer should prefer other instances).
  // The admin listener's /readyz and gRPC's health service say it.
  std::string NotReady() const;

  // Makes `set` the policies in force.
  void Publish(std::shared_ptr<const policy::PolicySet> set) {
    policies.store(std::move(set));
    policies_version.fetch_add(1, std::memory_order_release);
  }

  const Config config;  // as loaded at start (listeners, threads, limits of the process)
  // The ports the listeners were bound to (port 0 in the config: the
  // system's choice); 0 for a listener not opened. Set before serving.
  struct Ports {
    uint16_t main = 0, decision = 0, admin = 0, grpc = 0;
  } ports;
  const Clock* const clock;
  // Signs the decision API's lease tokens (lease_token.h): server.decision's
  // lease_secret_env as loaded at start, else random for this process.
  const std::string lease_secret = config.server.decision.lease_secret.empty()
                                       ? RandomLeaseSecret()
                                       : config.server.decision.lease_secret;
  // Signs the leases whose slots this process holds (a concurrency limit in
  // it, or a remote one's on_store_error fallback): always this process'
  // own, so that no other instance can give them back.
  const std::string own_lease_secret =
      config.server.decision.lease_secret.empty() ? lease_secret : RandomLeaseSecret();
  // Signs reservation ids: always this process' own (reservations.h).
  const std::string reservation_secret = RandomLeaseSecret();
  Reservations reservations;
  ReleasedSlots released_slots;
  MemoryStore store;
  std::unique_ptr<RedisStore> redis;  // store.redis: the shared store of global limits
  metrics::Metrics metrics;
  std::atomic<std::shared_ptr<const policy::PolicySet>> policies;
  // Bumped after each store to `policies`: event loops compare it with the
  // version they cached instead of loading the shared_ptr (whose reference
  // count would be one more cache line shared by every request).
  std::atomic<uint64_t> policies_version{0};
  std::atomic<bool> draining{false};
  // server.tls and server.decision.tls as last loaded (null: plain HTTP):
  // each connection is accepted with the context its listener has then,
  // so a reload's renewed certificate serves the connections after it.
  std::atomic<std::shared_ptr<tls::Context>> gateway_tls;
  std::atomic<std::shared_ptr<tls::Context>> decision_tls;
  // The client contexts of the routes to https:// upstreams, by route name,
  // as last loaded (their upstream_ca_file read then).
  using UpstreamContexts = absl::flat_hash_map<std::string, std::shared_ptr<tls::Context>>;
  std::atomic<std::shared_ptr<const UpstreamContexts>> upstream_tls;  // setup.h's same type
  // For the admin listener: where the config comes from (null in tests that
  // build a server without one), when the process started, and each
  // policy's decisions per second (sampled by the server).
  const ConfigSource* source = nullptr;
  const int64_t started_at_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count();
  DecisionSeries series;
  // POST /v1/sim (sim_endpoint.cc): one simulation at a time, on its own
  // thread, started and joined by the admin loop (and at the end of Run).
  std::atomic<bool> simulating{false};
  std::thread simulation;
  // grpc.listen: the Envoy rate limit service (src/envoy/). Declared after
  // the stores and metrics it uses, so destroyed before them.
  std::unique_ptr<envoy::RlsServer> rls;
};

}  // namespace sluice::server

#endif  // SLUICE_SERVER_STATE_H_
