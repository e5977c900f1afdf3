// What `sluice serve` sets up before it serves: the open file limit and
// what it leaves for connections, the listening sockets, the Redis store
// with its metrics.
#ifndef SLUICE_SERVER_SETUP_H_
#define SLUICE_SERVER_SETUP_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "metrics/metrics.h"
#include "server/loop.h"
#include "sluice/config.h"
#include "sluice/store/redis_store.h"

namespace sluice::server {

struct FileBudget {
  int64_t open_files = 0;            // RLIMIT_NOFILE, once raised
  int64_t per_listener = INT64_MAX;  // connections per listener it leaves room for
};

// Every connection holds a file descriptor. The soft limit is often far
// below what the hard limit allows (1024 against 524288 under systemd), so
// it is raised to the hard one, as NGINX's worker_rlimit_nofile would; the
// connection limits should then leave room for the rest (Redis, upstreams,
// the config file, the admin listener), or a flood of connections starves
// everything else, /metrics included. Logs a warning when
// server.max_connections does not fit.
FileBudget FitFileLimit(const Config& config);

// One listening socket on `where` (port 0: any), open in each of `loops`
// (one acceptor each, at the same index, on its own descriptor of the one
// socket): a loop that is free accepts the next connection, as NGINX's
// workers share a listener. No SO_REUSEPORT: a second process binding the
// port fails, where it would otherwise join the port's group and silently
// take a share of the connections.
absl::StatusOr<std::vector<std::unique_ptr<Acceptor>>> Listen(
    const HostPort& where, std::span<net::io_context* const> loops);

// The store of global limits (store.redis), its events logged, its health
// exported as sluice_redis_* gauges.
absl::StatusOr<std::unique_ptr<RedisStore>> ConnectRedis(const RedisStoreOptions& options,
                                                         metrics::Metrics& metrics);

}  // namespace sluice::server

#endif  // SLUICE_SERVER_SETUP_H_
