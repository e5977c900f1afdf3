#include "server/setup.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "base/cat.h"
#include "spdlog/spdlog.h"

namespace sluice::server {
namespace {

using internal::Cat;

constexpr int64_t kReservedFiles = 64;  // descriptors kept for all but client connections

void AddRedisMetrics(metrics::Metrics& m, RedisStore* redis) {
  m.SetHelp("sluice_store_errors_total",
            "Decisions made by on_store_error because Redis did not answer, by policy.");
  m.AddGauge("sluice_redis_up", "1 when every Redis slot has a connected master.", "gauge",
             [redis] { return redis->Health().up ? 1 : 0; });
  m.AddGauge("sluice_redis_nodes", "Redis masters known.", "gauge",
             [redis] { return redis->Health().nodes; });
  m.AddGauge("sluice_redis_nodes_up", "Redis masters connected.", "gauge",
             [redis] { return redis->Health().nodes_up; });
  m.AddGauge("sluice_redis_calls_total",
             "Function calls sent to Redis, each carrying one or more decisions.", "counter",
             [redis] { return static_cast<int64_t>(redis->Health().calls); });
  m.AddGauge("sluice_redis_decisions_total",
             "Decisions (and refunds) sent to Redis; several share a call when they are in "
             "flight together.",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().decisions); });
  m.AddGauge("sluice_redis_errors_total",
             "Redis calls failed: not connected (circuit open), connection lost, error reply.",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().errors); });
  m.AddGauge("sluice_redis_timeouts_total", "Redis calls not answered within the timeout.",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().timeouts); });
  m.AddGauge("sluice_redis_late_replies_total",
             "Replies to Redis calls that had timed out: the call ran, and was reconciled.",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().late_replies); });
  m.AddGauge("sluice_redis_reconnects_total", "Redis connections re-established.", "counter",
             [redis] { return static_cast<int64_t>(redis->Health().reconnects); });
  m.AddGauge("sluice_redis_redirects_total", "Redis Cluster MOVED and ASK answers followed.",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().redirects); });
  m.AddGauge("sluice_redis_denials_answered_total",
             "Requests denied without a Redis call: Redis had denied them, and the wait it "
             "named had not passed.",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().denials_answered); });
  m.AddGauge("sluice_lease_decisions_total",
             "Decisions of leased limits answered in this process, from a slice (or a window "
             "Redis said was full).",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().lease_decisions); });
  m.AddGauge("sluice_lease_slices_total", "Slices of leased limits Redis granted this process.",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().lease_slices); });
  m.AddGauge("sluice_lease_held_units",
             "Units of leased limits held in this process's slices now, unspent: quota the rest "
             "of the fleet cannot use until they are spent, given back or expire.",
             "gauge", [redis] { return static_cast<int64_t>(redis->Health().lease_held); });
  m.AddGauge("sluice_lease_returned_units_total",
             "Units of leased limits given back to Redis unused (a quiet key, a stop).", "counter",
             [redis] { return static_cast<int64_t>(redis->Health().lease_returned); });
  m.AddGauge("sluice_lease_expired_units_total",
             "Units of leased limits never spent nor given back: left when a window ended, a "
             "bucket's slots whose time passed (quota lost to the fleet).",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().lease_expired); });
}

}  // namespace

FileBudget FitFileLimit(const Config& config) {
  FileBudget out;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return out;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? std::max<rlim_t>(limit.rlim_cur, 1 << 20)
                                                      : limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  out.open_files =
      limit.rlim_cur == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(limit.rlim_cur);
  // What client connections may hold: all but the reserve and the gRPC
  // listener's own cap, shared by the gateway and decision listeners, two
  // descriptors each when a gateway connection can hold an upstream
  // connection too.
  const ServerConfig& sc = config.server;
  const int64_t listeners = sc.decision.listen ? 2 : 1;
  const int64_t per_connection = config.routes.empty() ? 1 : 2;
  const int64_t grpc = config.grpc ? config.grpc->max_connections : 0;
  out.per_listener =
      std::max<int64_t>(1, (out.open_files - kReservedFiles - std::min(grpc, out.open_files / 2)) /
                               listeners / per_connection);
  if (sc.max_connections > out.per_listener) {
    spdlog::warn(
        "event=start note=\"server.max_connections ({}) does not fit the open file "
        "limit ({}): connections per listener are capped at {}, keeping {} descriptors "
        "for the rest (upstreams, Redis, the admin listener); raise the limit (ulimit "
        "-n, LimitNOFILE) to allow more\"",
        sc.max_connections, out.open_files, out.per_listener, kReservedFiles);
  }
  return out;
}

absl::StatusOr<std::vector<std::unique_ptr<Acceptor>>> Listen(
    const HostPort& where, std::span<net::io_context* const> loops) {
  boost::system::error_code ec;
  tcp::resolver resolver(*loops.front());
  auto results = resolver.resolve(where.host, std::to_string(where.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return absl::InvalidArgumentError(Cat("cannot resolve ", where.host, ": ", ec.message()));
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  std::vector<std::unique_ptr<Acceptor>> acceptors;
  acceptors.push_back(std::make_unique<Acceptor>(loops.front()->get_executor()));
  Acceptor& first = *acceptors.front();
  first.open(endpoint.protocol(), ec);
  if (!ec) first.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) first.bind(endpoint, ec);
  if (!ec) first.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        Cat("cannot listen on ", where.host, ":", where.port, ": ", ec.message()));
  }
  for (net::io_context* loop : loops.subspan(1)) {
    const int fd = ::fcntl(first.native_handle(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
      return absl::UnavailableError(
          Cat("cannot listen on ", where.host, ":", where.port, ": ", std::strerror(errno)));
    }
    acceptors.push_back(std::make_unique<Acceptor>(loop->get_executor()));
    acceptors.back()->assign(endpoint.protocol(), fd, ec);
    if (ec) {
      ::close(fd);
      return absl::UnavailableError(
          Cat("cannot listen on ", where.host, ":", where.port, ": ", ec.message()));
    }
  }
  return acceptors;
}

absl::StatusOr<std::unique_ptr<RedisStore>> ConnectRedis(const RedisStoreOptions& options,
                                                         metrics::Metrics& metrics) {
  absl::StatusOr<std::unique_ptr<RedisStore>> redis =
      RedisStore::Connect(options, [](bool warning, std::string_view line) {
        if (warning) {
          spdlog::warn("{}", line);
        } else {
          spdlog::info("{}", line);
        }
      });
  if (!redis.ok()) {
    return absl::Status(redis.status().code(), Cat("store.redis: ", redis.status().message()));
  }
  AddRedisMetrics(metrics, redis->get());
  return redis;
}

}  // namespace sluice::server
