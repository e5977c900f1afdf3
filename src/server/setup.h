// What `sluice serve` sets up before it serves: the open file limit and
// what it leaves for connections, the listening sockets, the Redis store
// with its metrics.
#ifndef SLUICE_SERVER_SETUP_H_
#define SLUICE_SERVER_SETUP_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "metrics/metrics.h"
#include "server/loop.h"
#include "sluice/config.h"
#include "sluice/store/redis_store.h"
#include "tls/context.h"

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

// The CPU each loop runs on, one each (server.cpu_affinity), when there are
// at least two loops, as many as the CPUs this process may run on
// (sched_getaffinity: a cpuset or taskset narrows them); else none.
std::vector<int> LoopCpus(const ServerConfig& config, size_t loops);

// Keeps the calling thread on `cpu`: 0, or the error number.
int PinThread(int cpu);

// Listens on `where` (port 0: any) in each of `loops`, one acceptor each at
// the same index.
// - With `cpus` (LoopCpus), each loop has a socket of its own in one
//   SO_REUSEPORT group, and a program attached to the group (classic BPF)
//   hands a connection to the loop on the CPU it was made from: on
//   loopback, a client thread and the loop answering it take turns on one
//   CPU instead of waking each other across two (bench/README.md, "The
//   connections' CPU"). The program only ever picks the first
//   loops.size() sockets of the group, so a socket another process adds to
//   it later is never given a connection; and a second process binding
//   the port without SO_REUSEPORT, as a second sluice does first, fails.
//   Where the program cannot be attached, a warning, and the one socket.
// - Without, one socket, each loop holding its own descriptor of it: a
//   loop that is free accepts the next connection.
absl::StatusOr<std::vector<std::unique_ptr<Acceptor>>> Listen(
    const HostPort& where, std::span<net::io_context* const> loops, std::span<const int> cpus);

// The store of global limits (store.redis), its events logged, its health
// exported as sluice_redis_* gauges.
absl::StatusOr<std::unique_ptr<RedisStore>> ConnectRedis(const RedisStoreOptions& options,
                                                         metrics::Metrics& metrics);

// The TLS context of a listener's `tls` (null when it has none), its files
// read now; `protocol` is the one chosen by ALPN.
absl::StatusOr<std::shared_ptr<tls::Context>> ListenerContext(
    const std::optional<ListenerTls>& t, std::string_view who,
    tls::Protocol protocol = tls::Protocol::kHttp11);

// The client contexts of the routes to https:// upstreams, by route name,
// their files read now.
using UpstreamContexts = absl::flat_hash_map<std::string, std::shared_ptr<tls::Context>>;
absl::StatusOr<std::shared_ptr<UpstreamContexts>> MakeUpstreamContexts(const Config& config);

// Every TLS file of `config` made into the context that will use it (the
// listeners' tls, grpc.tls, the https upstreams', store.redis.tls), as a
// start makes them: the first error a start would meet (a key that is not
// its certificate's, a file that holds no certificate), for `sluice serve
// --check`.
absl::Status CheckTlsFiles(const Config& config);

}  // namespace sluice::server

#endif  // SLUICE_SERVER_SETUP_H_
