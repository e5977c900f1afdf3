#include "server/setup.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "base/cat.h"
#include "base/cpus.h"
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
  m.AddGauge("sluice_redis_single_calls_total",
             "Calls to Redis that carried a single decision; under load, a large share of "
             "sluice_redis_calls_total means coalescing found nothing to join them to.",
             "counter", [redis] { return static_cast<int64_t>(redis->Health().single_calls); });
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

std::vector<int> LoopCpus(const ServerConfig& config, size_t loops) {
  if (!config.cpu_affinity || loops < 2) return {};
  // Only a process that has a thread for every CPU it may run on owns
  // them: two instances with fewer threads each would pin theirs to the
  // same first CPUs.
  std::vector<int> cpus = AllowedCpus();
  if (cpus.size() != loops) return {};
  return cpus;
}

int PinThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

namespace {

absl::Status CannotListen(const HostPort& where, std::string_view why) {
  return absl::UnavailableError(Cat("cannot listen on ", where.host, ":", where.port, ": ", why));
}

// The group's program: the index of the loop on the CPU the connection
// comes from; from any other CPU, that CPU modulo the number of loops.
absl::Status SteerByCpu(int fd, std::span<const int> cpus) {
  std::vector<sock_filter> code;
  code.push_back({BPF_LD | BPF_W | BPF_ABS, 0, 0, static_cast<uint32_t>(SKF_AD_OFF + SKF_AD_CPU)});
  for (size_t i = 0; i < cpus.size(); ++i) {
    code.push_back({BPF_JMP | BPF_JEQ | BPF_K, 0, 1, static_cast<uint32_t>(cpus[i])});
    code.push_back({BPF_RET | BPF_K, 0, 0, static_cast<uint32_t>(i)});
  }
  code.push_back({BPF_ALU | BPF_MOD | BPF_K, 0, 0, static_cast<uint32_t>(cpus.size())});
  code.push_back({BPF_RET | BPF_A, 0, 0, 0});
  const sock_fprog program{static_cast<uint16_t>(code.size()), code.data()};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &program, sizeof program) != 0) {
    return absl::ErrnoToStatus(errno, "SO_ATTACH_REUSEPORT_CBPF");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Acceptor>>> Listen(
    const HostPort& where, std::span<net::io_context* const> loops, std::span<const int> cpus) {
  boost::system::error_code ec;
  tcp::resolver resolver(*loops.front());
  auto results = resolver.resolve(where.host, std::to_string(where.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return absl::InvalidArgumentError(Cat("cannot resolve ", where.host, ": ", ec.message()));
  }
  tcp::endpoint endpoint = results.begin()->endpoint();
  bool steered = cpus.size() == loops.size() && loops.size() > 1;
  std::vector<std::unique_ptr<Acceptor>> acceptors;
  if (steered && endpoint.port() != 0) {
    // A port someone already listens on, even in a group of their own, is
    // taken: this bind without SO_REUSEPORT fails where joining would not.
    Acceptor probe(loops.front()->get_executor());
    probe.open(endpoint.protocol(), ec);
    if (!ec) probe.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) probe.bind(endpoint, ec);
    if (ec) return CannotListen(where, ec.message());
  }
  auto bind = [&](net::io_context& loop, bool reuse_port) -> std::unique_ptr<Acceptor> {
    auto acceptor = std::make_unique<Acceptor>(loop.get_executor());
    acceptor->open(endpoint.protocol(), ec);
    if (!ec) acceptor->set_option(net::socket_base::reuse_address(true), ec);
    if (!ec && reuse_port) {
      acceptor->set_option(net::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true), ec);
    }
    if (!ec) acceptor->bind(endpoint, ec);
    return acceptor;
  };
  for (size_t i = 0; i < (steered ? loops.size() : 1); ++i) {
    std::unique_ptr<Acceptor> acceptor = bind(*loops[i], steered);
    if (ec) return CannotListen(where, ec.message());
    if (steered && i == 0) {
      if (absl::Status s = SteerByCpu(acceptor->native_handle(), cpus); !s.ok()) {
        // A group without its program would spread connections by hash,
        // to anyone who joins it too: one socket instead.
        spdlog::warn(
            "event=start note=\"{}:{}: connections are not steered to the CPU they "
            "come from ({}): one socket for every thread instead\"",
            where.host, where.port, std::string(s.message()));
        steered = false;
        acceptor->close(ec);
        acceptor = bind(*loops[i], false);
        if (ec) return CannotListen(where, ec.message());
      }
    }
    // The group's order is the order of listen(): socket i is loop i's.
    acceptor->listen(net::socket_base::max_listen_connections, ec);
    if (ec) return CannotListen(where, ec.message());
    endpoint.port(acceptor->local_endpoint().port());  // port 0: the others join the one chosen
    acceptors.push_back(std::move(acceptor));
  }
  for (size_t i = acceptors.size(); i < loops.size(); ++i) {
    const int fd = ::fcntl(acceptors.front()->native_handle(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CannotListen(where, std::strerror(errno));
    acceptors.push_back(std::make_unique<Acceptor>(loops[i]->get_executor()));
    acceptors.back()->assign(endpoint.protocol(), fd, ec);
    if (ec) {
      ::close(fd);
      return CannotListen(where, ec.message());
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

absl::StatusOr<std::shared_ptr<tls::Context>> ListenerContext(const std::optional<ListenerTls>& t,
                                                              std::string_view who,
                                                              tls::Protocol protocol) {
  if (!t.has_value()) return nullptr;
  return tls::ServerContext({.cert_file = t->cert_file,
                             .key_file = t->key_file,
                             .ca_file = t->client_ca_file,
                             .peer_name = t->client_name,
                             .by_name = t->certificates},
                            who, protocol);
}

absl::StatusOr<std::shared_ptr<UpstreamContexts>> MakeUpstreamContexts(const Config& config) {
  auto upstreams = std::make_shared<UpstreamContexts>();
  for (const RouteConfig& route : config.routes) {
    if (!route.upstream_tls) continue;
    absl::StatusOr<std::shared_ptr<tls::Context>> made =
        tls::ClientContext({.cert_file = route.upstream_cert_file,
                            .key_file = route.upstream_key_file,
                            .ca_file = route.upstream_ca_file},
                           internal::Cat("routes \"", route.name, "\" upstream tls"));
    if (!made.ok()) return made.status();
    (*upstreams)[route.name] = *std::move(made);
  }
  return upstreams;
}

absl::Status CheckTlsFiles(const Config& config) {
  for (const auto& [tls, who, protocol] :
       {std::tuple{&config.server.tls, "server.tls", tls::Protocol::kHttp11},
        {&config.server.decision.tls, "server.decision.tls", tls::Protocol::kHttp11},
        {config.grpc ? &config.grpc->tls : nullptr, "grpc.tls", tls::Protocol::kHttp2}}) {
    if (tls == nullptr) continue;
    if (absl::Status s = ListenerContext(*tls, who, protocol).status(); !s.ok()) return s;
  }
  if (absl::Status s = MakeUpstreamContexts(config).status(); !s.ok()) return s;
  if (config.store.redis.has_value() && config.store.redis->tls.enabled) {
    const RedisTls& t = config.store.redis->tls;
    if (absl::Status s =
            tls::ClientContext(
                {.cert_file = t.cert_file, .key_file = t.key_file, .ca_file = t.ca_file},
                "redis tls")
                .status();
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::server
