// The transport of `sluice serve`: listeners, connections, reading a
// request and writing its answer, deadlines, the drain; and the wiring of
// the parts: the stores, the policies in force (swapped in by the config
// source), the endpoints (endpoints.h), the gateway (gateway.h) and the
// Envoy rate limit service (src/envoy/). The endpoints answer values; only
// this file and gateway.cc read and write HTTP.
#include "server/server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/http/parser.hpp>

#include "absl/strings/str_join.h"
#include "base/cat.h"
#include "base/cpus.h"
#include "server/dispatch.h"
#include "server/endpoints.h"
#include "server/gateway.h"
#include "server/http.h"
#include "server/setup.h"
#include "server/tls_socket.h"
#include "spdlog/spdlog.h"
#include "tls/context.h"

namespace sluice::server {
namespace {

namespace beast = boost::beast;
using internal::Cat;
using metrics::Counter;
using metrics::Metrics;
using policy::PolicySet;
using policy::RequestFacts;

// What a connection is read and written through: the socket itself, or TLS
// on it.
template <bool kTls>
using StreamOf = std::conditional_t<kTls, TlsSocket, Socket&>;

template <bool kTls>
StreamOf<kTls> OpenStream(Socket& socket, tls::Context* context) {
  if constexpr (kTls) {
    return TlsSocket(socket, *context);
  } else {
    return socket;
  }
}

// WriteNow (loop.h), through TLS.
inline bool WriteNow(TlsSocket& stream, std::array<net::const_buffer, 2>& buffers,
                     boost::system::error_code& ec) {
  return stream.WriteNow(buffers, ec);
}

// Writes the rest of `buffers`, waiting for room.
inline auto WriteRest(Socket& stream, const std::array<net::const_buffer, 2>& buffers,
                      boost::system::error_code& ec) {
  return net::async_write(stream, buffers, net::redirect_error(kUseAwaitable, ec));
}
inline Task<void> WriteRest(TlsSocket& stream, const std::array<net::const_buffer, 2>& buffers,
                            boost::system::error_code& ec) {
  return stream.Write(buffers, ec);
}

// The upstream's end of a tunnel, read and written through TLS for an
// https:// upstream.
Task<size_t> ReadUpstream(UpstreamConnection& up, net::mutable_buffer room,
                          boost::system::error_code& ec) {
  if (up.tls != nullptr) {
    co_return co_await up.tls->ReadSome(room, net::redirect_error(kUseAwaitable, ec));
  }
  co_return co_await up.socket.ReadSome(room, net::redirect_error(kUseAwaitable, ec));
}
Task<void> WriteUpstream(UpstreamConnection& up, std::array<net::const_buffer, 2> data,
                         boost::system::error_code& ec) {
  if (up.tls != nullptr) {
    if (!up.tls->WriteNow(data, ec) && !ec) co_await up.tls->Write(data, ec);
  } else if (!WriteNow(up.socket, data, ec) && !ec) {
    co_await net::async_write(up.socket, data, net::redirect_error(kUseAwaitable, ec));
  }
}

// Writes `data` to the client, in a chunk of its own when `chunked`;
// `framed` is room the chunk is made in.
template <typename Stream>
Task<void> WriteBodyPart(Stream& client, bool chunked, std::string_view data, std::string& framed,
                         boost::system::error_code& ec) {
  std::array<net::const_buffer, 2> parts{net::buffer(data.data(), data.size()),
                                         net::const_buffer()};
  if (chunked) {
    framed.clear();
    AppendChunk(data, framed);
    parts[0] = net::buffer(framed);
  }
  if (!WriteNow(client, parts, ec) && !ec) co_await WriteRest(client, parts, ec);
}

// The rest of a streamed answer's body (gateway.cc, StreamsItsBody), from
// its upstream to the client as it comes: each read of the upstream
// within `timeout` (server.upstream_timeout), each write to the client
// within its own `client_timeout`. Once the body has all gone, the
// upstream's connection goes back to its pool if it keeps it. False when
// the body was cut short (the upstream failed or was too slow, the client
// went, or a drain ran out): the client's connection must end then, or it
// would take what comes next for the rest of the body.
template <typename Stream>
Task<bool> StreamBody(Worker& w, Stream& client, Socket& client_socket, Deadline& client_deadline,
                      Relayed& relayed, Duration timeout, Duration client_timeout) {
  AfterHead& b = *relayed.after;
  UpstreamConnection& up = *b.upstream;
  AnswerParser& parser = *b.parser;
  Worker::TunnelEnds ends{&client_socket, &up.socket, b.hold.get(), /*tunnel=*/false};
  const auto self = w.tunnels.insert(w.tunnels.end(), &ends);
  w.relaying.fetch_add(1, std::memory_order_relaxed);
  Deadline up_deadline(w, up.socket);
  boost::system::error_code ec;
  std::string framed;
  client_deadline.After(client_timeout);
  if (!relayed.answer.body.empty()) {
    co_await WriteBodyPart(client, relayed.chunked, relayed.answer.body, framed, ec);
    relayed.answer.body.clear();
  }
  while (!ec && !parser.is_done()) {
    up_deadline.After(timeout);
    // 64 KiB of room: read_size would offer only what the buffer has
    // (512 bytes a read from a buffer that held a small head).
    const net::mutable_buffer room = up.buffer.prepare(64 * 1024);
    const size_t got = co_await ReadUpstream(up, room, ec);
    if (ec == net::error::eof) {
      EndOfInput(parser, ec);  // a body the connection's end ends, or one cut short
    } else if (!ec) {
      up.buffer.commit(got);
      FeedParser(parser, up.buffer, ec);
    }
    std::string& part = parser.get().body;
    if (!ec && !part.empty()) {
      client_deadline.After(client_timeout);
      co_await WriteBodyPart(client, relayed.chunked, part, framed, ec);
    }
    part.clear();
  }
  w.tunnels.erase(self);
  w.relaying.fetch_sub(1, std::memory_order_relaxed);
  if (ec || !parser.is_done()) co_return false;
  if (relayed.chunked) {
    co_await WriteBodyPart(client, true, std::string_view(), framed, ec);  // the last chunk
    if (ec) co_return false;
  }
  if (parser.keep_alive() && up.buffer.size() == 0) {
    up_deadline.Never();
    if (b.tls_pool.empty()) {
      w.pool.Give(b.pool, std::move(b.upstream));
    } else {
      w.tls_pool.Give(b.tls_pool, std::move(b.upstream));
    }
  }
  co_return true;
}

// A WebSocket relayed (routes[].websocket), once the upstream switched
// protocols: what either side sends goes to the other as it comes (what
// each sent beyond the handshake first), until either ends its side or
// fails, neither sends anything for `idle`, or a drain shuts the tunnel
// (Worker::tunnels). One coroutine copies each way; when either stops,
// the other is made to stop, and this returns once both have.
template <typename Stream>
Task<void> RunTunnel(Worker& w, Stream& client, Socket& client_socket, Deadline& client_deadline,
                     beast::flat_buffer& from_client, AfterHead& after, Duration idle) {
  UpstreamConnection& up = *after.upstream;
  Worker::TunnelEnds ends{&client_socket, &up.socket, after.hold.get(), /*tunnel=*/true};
  const auto self = w.tunnels.insert(w.tunnels.end(), &ends);
  w.relaying.fetch_add(1, std::memory_order_relaxed);
  Deadline up_deadline(w, up.socket);
  const auto moved = [&] {
    client_deadline.After(idle);
    up_deadline.After(idle);
  };
  moved();
  bool down_done = false;
  Timer down_ended(w.ioc.get_executor(), Timer::time_point::max());
  net::co_spawn(
      w.ioc,
      [&]() -> Task<void> {  // down: the upstream's bytes to the client
        boost::system::error_code ec;
        std::array<char, 16 * 1024> chunk;
        std::array<net::const_buffer, 2> data{up.buffer.data(), net::const_buffer()};
        if (data[0].size() > 0 && !WriteNow(client, data, ec) && !ec) {
          co_await WriteRest(client, data, ec);
        }
        up.buffer.consume(up.buffer.size());
        while (!ec) {
          const size_t n = co_await ReadUpstream(up, net::buffer(chunk), ec);
          if (ec || n == 0) break;
          moved();
          data = {net::buffer(chunk.data(), n), net::const_buffer()};
          if (!WriteNow(client, data, ec) && !ec) co_await WriteRest(client, data, ec);
        }
        // Nothing more comes from the upstream: the client's side ends too.
        boost::system::error_code ignored;
        client_socket.shutdown(Socket::shutdown_receive, ignored);
        down_done = true;
        down_ended.cancel();
      },
      net::detached);
  // Up: the client's bytes to the upstream.
  boost::system::error_code ec;
  while (!ec) {
    if (from_client.size() == 0) {
      const size_t n = co_await client.ReadSome(from_client.prepare(16 * 1024),
                                                net::redirect_error(kUseAwaitable, ec));
      if (ec || n == 0) break;
      from_client.commit(n);
      moved();
    }
    co_await WriteUpstream(up, {from_client.data(), net::const_buffer()}, ec);
    from_client.consume(from_client.size());
  }
  // Nothing more comes from the client: the upstream's side ends, and a
  // write to the client still waiting for room is given up.
  boost::system::error_code ignored;
  up.socket.shutdown(Socket::shutdown_both, ignored);
  client_socket.cancel(ignored);
  if (!down_done) co_await down_ended.async_wait(net::redirect_error(kUseAwaitable, ignored));
  w.tunnels.erase(self);
  w.relaying.fetch_sub(1, std::memory_order_relaxed);
}

// Keys of a valid config that are read and not acted on, logged at start.
void LogWarnings(const Config& config) {
  for (const std::string& line : ConfigWarnings(config)) {
    spdlog::warn("event=start note=\"{}\"", line);
  }
}

class ServerImpl final : public Server {
 public:
  ServerImpl(ConfigSource& source, const Clock* clock, LifecycleHook lifecycle)
      : source_(source),
        state_(std::make_unique<ServerState>(source.initial(), clock)),
        lifecycle_(std::move(lifecycle)) {
    state_->source = &source_;
    Metrics& m = state_->metrics;
    m.SetHelp("sluice_decisions_total", "Decisions, by policy and outcome.");
    m.SetHelp("sluice_upstream_errors_total", "Failed upstream exchanges, by route and kind.");
    m.SetHelp("sluice_http_responses_total", "Responses sent, by listener and status code.");
    m.SetHelp("sluice_slow_uploads_total",
              "Uploads cut off because their client sent less than the route's "
              "min_upload_rate on average, by route.");
    m.SetHelp("sluice_connections_refused_total",
              "Connections closed at once: the listener had server.max_connections open.");
    m.SetHelp("sluice_tls_handshake_failures_total",
              "TLS handshakes that failed (reason=failed) or did not finish within "
              "server.read_timeout, grpc.handshake_timeout on grpc (reason=timeout), by "
              "listener.");
    m.SetHelp("sluice_connections_moved_total",
              "Connections moved to the thread on the CPU their client sends from.");
    MemoryStore& store = state_->store;
    m.AddGauge("sluice_keys", "Keys held by the memory store.", "gauge",
               [&store] { return store.stats().keys; });
    m.AddGauge("sluice_forced_evictions_total",
               "Keys evicted while not fresh because max_keys was reached.", "counter",
               [&store] { return store.stats().forced_evictions; });
    m.AddGauge("sluice_fresh_evictions_total",
               "Keys dropped because their state was back to fresh.", "counter",
               [&store] { return store.stats().fresh_evictions; });
    m.AddGauge("sluice_remembered_evictions_total",
               "Keys evicted while not fresh whose fresh time was remembered (on_full: remember).",
               "counter", [&store] { return store.stats().remembered; });
    m.AddGauge("sluice_recalled_decisions_total",
               "Decisions on keys not held that started from a remembered state (on_full: "
               "remember): returning keys, and new keys sharing their cells.",
               "counter", [&store] { return store.stats().recalled; });
    m.AddGauge("sluice_new_keys_denied_total",
               "New keys denied because the memory store was full (on_full: deny_new).", "counter",
               [&store] { return store.stats().denied_new; });
    m.AddGauge("sluice_remembered_bytes",
               "Memory of the table of remembered keys (allocated at the first eviction).", "gauge",
               [&store] { return store.stats().remembered_bytes; });
  }

  absl::Status Init() {
    // OpenSSL writes a TLS connection's socket with write(2): to a client
    // gone, that raises SIGPIPE, whose default ends the process (Asio's
    // own writes say MSG_NOSIGNAL). The write fails with EPIPE instead.
    std::signal(SIGPIPE, SIG_IGN);
    const FileBudget files = FitFileLimit(state_->config);
    open_files_ = files.open_files;
    file_cap_ = files.per_listener;
    if (state_->config.store.redis) {
      absl::StatusOr<std::unique_ptr<RedisStore>> redis =
          ConnectRedis(*state_->config.store.redis, state_->metrics);
      if (!redis.ok()) return redis.status();
      state_->redis = *std::move(redis);
    }
    absl::StatusOr<std::shared_ptr<const PolicySet>> set =
        PolicySet::Create(state_->config, state_->store, state_->redis.get(), *state_->clock,
                          nullptr, state_->metrics);
    if (!set.ok()) return set.status();
    state_->Publish(*std::move(set));
    if (absl::Status s = LoadTls(state_->config); !s.ok()) return s;
    const int threads = state_->config.server.Loops();
    const int cpus = UsableCpus();
    if (threads > cpus) {
      // Loops that take turns on fewer CPUs split each other's turns: fewer
      // requests a turn, and smaller Redis calls (docs/distributed.md).
      spdlog::warn(
          "event=start note=\"server.threads ({}) is more than the CPUs sluice may run on "
          "({}): its loops take turns on them, each turn holds fewer requests, and each "
          "Redis call fewer decisions; leave threads at 0 for one loop a CPU\"",
          threads, cpus);
    }
    for (int i = 0; i < threads; ++i) workers_.push_back(std::make_unique<Worker>());
    // The main and decision listeners, open in every loop (setup.h).
    std::vector<net::io_context*> loops;
    for (auto& w : workers_) loops.push_back(&w->ioc);
    loop_cpus_ = LoopCpus(state_->config.server, loops.size());
    absl::StatusOr<std::vector<std::unique_ptr<Acceptor>>> main =
        Listen(state_->config.server.listen, loops, loop_cpus_);
    if (!main.ok()) return main.status();
    for (size_t i = 0; i < workers_.size(); ++i) workers_[i]->acceptor = std::move((*main)[i]);
    port_ = workers_[0]->acceptor->local_endpoint().port();
    if (std::optional<HostPort> decision = state_->config.server.decision.listen) {
      absl::StatusOr<std::vector<std::unique_ptr<Acceptor>>> acceptors =
          Listen(*decision, loops, loop_cpus_);
      if (!acceptors.ok()) return acceptors.status();
      for (size_t i = 0; i < workers_.size(); ++i) {
        workers_[i]->decision_acceptor = std::move((*acceptors)[i]);
      }
      decision_port_ = workers_[0]->decision_acceptor->local_endpoint().port();
    }
    absl::StatusOr<std::vector<std::unique_ptr<Acceptor>>> admin =
        Listen(state_->config.server.admin, std::span(loops).first(1), {});
    if (!admin.ok()) return admin.status();
    admin_acceptor_ = std::move(admin->front());
    admin_port_ = admin_acceptor_->local_endpoint().port();
    if (state_->config.grpc) {  // the Envoy rate limit service, on its own listener
      absl::StatusOr<std::unique_ptr<envoy::RlsServer>> rls =
          envoy::RlsServer::Start(state_->config,
                                  {.local = &state_->store,
                                   .shared = state_->redis.get(),
                                   .clock = state_->clock,
                                   .metrics = &state_->metrics},
                                  [state = state_.get()] { return state->NotReady().empty(); });
      if (!rls.ok()) return rls.status();
      state_->rls = *std::move(rls);
    }
    state_->ports = {.main = port_,
                     .decision = decision_port_,
                     .admin = admin_port_,
                     .grpc = state_->rls != nullptr ? state_->rls->port() : uint16_t{0}};
    ShowErrorSeries(state_->config);
    return absl::OkStatus();
  }

  // The error counters are in /metrics at 0 from the start (a reload's new
  // routes' from the reload), not only after their first event: an alert on
  // their rate has a series to read before anything went wrong.
  void ShowErrorSeries(const Config& config) {
    Metrics& m = state_->metrics;
    m.Get("sluice_connections_refused_total", {});
    moved_ = m.Get("sluice_connections_moved_total", {});
    for (int l = 0; l < kListeners; ++l) {
      if (static_cast<Listener>(l) == Listener::kDecision && decision_port_ == 0) continue;
      for (const char* reason : {"fd_limit", "memory"}) {
        m.Get("sluice_accept_errors_total",
              {{"listener", std::string(kListenerNames[l])}, {"reason", reason}});
      }
      const bool tls =
          (static_cast<Listener>(l) == Listener::kGateway && config.server.tls) ||
          (static_cast<Listener>(l) == Listener::kDecision && config.server.decision.tls);
      if (tls) {
        TlsHandshakeFailed(static_cast<Listener>(l), false);
        TlsHandshakeFailed(static_cast<Listener>(l), true);
      }
    }
    for (const RouteConfig& route : config.routes) {
      for (const char* kind : {"connect", "timeout", "exchange"}) {
        m.Get("sluice_upstream_errors_total", {{"route", route.name}, {"kind", kind}});
      }
      if (route.StreamsUploads(config.server.max_body_bytes)) {
        m.Get("sluice_slow_uploads_total", {{"route", route.name}});
      }
    }
  }

  absl::Status Run() override {
    for (auto& w : workers_) {
      net::co_spawn(w->ioc, Accept(*w, *w->acceptor, Listener::kGateway), net::detached);
      if (w->decision_acceptor != nullptr) {
        net::co_spawn(w->ioc, Accept(*w, *w->decision_acceptor, Listener::kDecision),
                      net::detached);
      }
      net::co_spawn(w->ioc, Sweep(*w), net::detached);
    }
    net::co_spawn(workers_[0]->ioc, Accept(*workers_[0], *admin_acceptor_, Listener::kAdmin),
                  net::detached);
    net::co_spawn(workers_[0]->ioc, SampleSeries(*workers_[0]), net::detached);
    net::signal_set signals(workers_[0]->ioc, SIGTERM, SIGINT, SIGHUP);
    std::function<void(const boost::system::error_code&, int)> on_signal =
        [&](const boost::system::error_code& ec, int sig) {
          if (ec) return;
          if (sig == SIGHUP) {
            source_.Reload("SIGHUP");
            signals.async_wait(on_signal);
            return;
          }
          spdlog::info("event=signal signal={} action=drain",
                       sig == SIGTERM ? "SIGTERM" : "SIGINT");
          Stop();
        };
    signals.async_wait(on_signal);
    source_.Subscribe([this](const Config& next) { return Apply(next); });
    source_.OnLifecycle([this](Lifecycle what, std::string_view status) { Tell(what, status); });
    source_.Start(state_->metrics);
    // The addresses bound (a port 0 in the config is the one the OS gave).
    const std::string listen_at = HostPortText({state_->config.server.listen.host, port_});
    const std::string admin_at = HostPortText({state_->config.server.admin.host, admin_port_});
    const DecisionConfig& dc = state_->config.server.decision;
    std::string decision = "off";
    if (dc.listen) {
      decision = HostPortText({dc.listen->host, decision_port_});
    } else if (state_->config.routes.empty() || dc.on_gateway_listener) {
      decision = "listen";
    }
    std::vector<std::string> tls;
    if (state_->config.server.tls) tls.push_back("listen");
    if (dc.tls) tls.push_back("decision");
    spdlog::info(
        "event=start listen={} admin={} threads={} policies={} routes={} "
        "decision={} decision_tokens={} open_files={} cpus={} tls={}",
        listen_at, admin_at, workers_.size(), state_->config.policies.size(),
        state_->config.routes.size(), decision, dc.tokens.size(), open_files_,
        loop_cpus_.empty() ? std::string("any") : absl::StrJoin(loop_cpus_, ","),
        tls.empty() ? std::string("off") : absl::StrJoin(tls, ","));
    LogWarnings(state_->config);
    if (decision == "off") {
      spdlog::warn(
          "event=start note=\"the decision API (/v1/check, /v1/auth) is not served: "
          "routes are configured and server.decision.listen is not set\"");
    }
    // Ready once the first loop runs: every listener is bound, and the
    // other loops are started just below.
    net::post(
        workers_[0]->ioc,
        [this, status = Cat("serving: ", state_->config.policies.size(), " policies, listen ",
                            listen_at, ", admin ", admin_at)] { Tell(Lifecycle::kReady, status); });
    // Each loop on its CPU (server.cpu_affinity), so that the connections
    // its socket is handed, made from that CPU, are answered there.
    auto run = [this](size_t i) {
      if (const int error = loop_cpus_.empty() ? 0 : PinThread(loop_cpus_[i]); error != 0) {
        spdlog::warn("event=start note=\"thread {} could not be kept on CPU {}: {}\"", i,
                     loop_cpus_[i], std::strerror(error));
      }
      workers_[i]->ioc.run();
    };
    std::vector<std::thread> threads;
    for (size_t i = 1; i < workers_.size(); ++i) threads.emplace_back(run, i);
    run(0);
    for (std::thread& t : threads) t.join();
    if (state_->simulation.joinable()) state_->simulation.join();
    source_.Stop();  // a reload under way finishes (its log line included)
    if (state_->rls != nullptr) state_->rls->Wait();  // its drain, begun by Stop
    // The store goes while the loops still exist: a Redis call still pending
    // (drain_timeout shorter than store.redis.timeout, a stalled Redis) is
    // answered Cancelled now, and its answer is posted to a loop that is
    // stopped but alive, which frees it with the coroutine waiting for it.
    // Destroyed after the loops, it posted into freed memory.
    state_->redis.reset();
    spdlog::info("event=stop in_flight={}", state_->metrics.in_flight().value());
    return absl::OkStatus();
  }

  // Stop accepting, let in-flight requests finish (within drain_timeout),
  // then stop every loop.
  void Stop() override {
    if (state_->draining.exchange(true)) return;
    Tell(Lifecycle::kStopping, Cat("draining: in-flight requests get up to ",
                                   FormatDuration(state_->config.server.drain_timeout)));
    if (state_->rls != nullptr) state_->rls->Shutdown(state_->config.server.drain_timeout);
    for (auto& w : workers_) {
      net::post(w->ioc, [w = w.get()] {
        boost::system::error_code ignored;
        w->acceptor->close(ignored);
        if (w->decision_acceptor != nullptr) w->decision_acceptor->close(ignored);
        // Open tunnels end now: the drain waits for them as for requests
        // (a body streamed goes on within drain_timeout).
        w->ShutRelays(/*bodies=*/false);
      });
    }
    net::post(workers_[0]->ioc, [this] {
      boost::system::error_code ignored;
      admin_acceptor_->close(ignored);
    });
    net::co_spawn(workers_[0]->ioc, Drain(), net::detached);
  }

  uint16_t port() const override { return port_; }
  uint16_t admin_port() const override { return admin_port_; }
  uint16_t decision_port() const override { return decision_port_; }

 private:
  // Tells ServerOptions::lifecycle, one call at a time, and nothing after
  // kStopping: a reload that ends during the drain is no news to the
  // supervisor, the process is stopping.
  void Tell(Lifecycle what, std::string_view status) {
    if (!lifecycle_) return;
    std::lock_guard lock(lifecycle_mu_);
    if (stopping_told_) return;
    stopping_told_ = what == Lifecycle::kStopping;
    lifecycle_(what, status);
  }

  // sluice_http_responses_total, one cached counter per listener and code.
  Counter* Responses(Listener listener, int code) {
    if (code < 100 || code > 599) code = 599;
    const int l = static_cast<int>(listener);
    std::atomic<Counter*>& slot = responses_[l][code];
    Counter* c = slot.load(std::memory_order_acquire);
    if (c == nullptr) {
      c = state_->metrics.Get(
          "sluice_http_responses_total",
          {{"listener", std::string(kListenerNames[l])}, {"code", std::to_string(code)}});
      slot.store(c, std::memory_order_release);
    }
    return c;
  }

  Counter& Connections(Listener listener) {
    Metrics& m = state_->metrics;
    switch (listener) {
      case Listener::kGateway:
        return m.connections();
      case Listener::kDecision:
        return m.decision_connections();
      case Listener::kAdmin:
        break;
    }
    return m.admin_connections();
  }

  Task<void> Accept(Worker& w, Acceptor& acceptor, Listener listener) {
    Timer backoff(w.ioc.get_executor());
    for (;;) {
      boost::system::error_code ec;
      Socket socket(w.ioc.get_executor());
      co_await acceptor.async_accept(socket, net::redirect_error(kUseAwaitable, ec));
      if (ec) {
        if (!acceptor.is_open()) co_return;
        const int e = ec.category() == boost::system::system_category() ? ec.value() : 0;
        if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
          // The connection stays in the listen queue, so accepting again at
          // once fails again at once: without a pause this loop would spin
          // a core while serving nothing. Pause, keep serving the
          // connections we have, and try again.
          AcceptFailed(listener, e == EMFILE || e == ENFILE ? "fd_limit" : "memory", ec);
          backoff.expires_after(std::chrono::milliseconds(kAcceptBackoffMs));
          co_await backoff.async_wait(net::redirect_error(kUseAwaitable, ec));
        }
        continue;
      }
      // The limit guards the gateway and decision listeners, each its own
      // count; the admin listener stays reachable when they are full (that
      // is when operators need /metrics).
      if (listener != Listener::kAdmin &&
          Connections(listener).value() >=
              std::min(w.Current(*state_)->config().server.max_connections, file_cap_)) {
        socket.close(ec);  // over the connection limit: refuse at once
        state_->metrics.Get("sluice_connections_refused_total", {})->Add();
        continue;
      }
      std::shared_ptr<tls::Context> tls;
      if (listener == Listener::kGateway) tls = state_->gateway_tls.load();
      if (listener == Listener::kDecision) tls = state_->decision_tls.load();
      net::co_spawn(acceptor.get_executor(),
                    Session(w, std::move(socket), listener, std::move(tls)), net::detached);
    }
  }

  static constexpr int64_t kAcceptBackoffMs = 100;

  // Whether a message that may come often is logged now: at most once per
  // kIntervalMs; `skipped` gets how many were not logged since the last.
  class LogThrottle {
   public:
    static constexpr int64_t kIntervalMs = 10'000;
    bool Due(int64_t* skipped) {
      const int64_t now = Worker::SteadyMs();
      int64_t last = logged_ms_.load(std::memory_order_relaxed);
      if (now - last < kIntervalMs || !logged_ms_.compare_exchange_strong(last, now)) {
        unlogged_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      *skipped = unlogged_.exchange(0, std::memory_order_relaxed);
      return true;
    }

   private:
    std::atomic<int64_t> logged_ms_{INT64_MIN / 2};
    std::atomic<int64_t> unlogged_{0};
  };

  // One unit of a gauge (a connection, a request in flight), given back
  // when the holder goes, however the coroutine holding it ends: an
  // exception unwinding a session must not leave a connection counted
  // against server.max_connections for ever.
  class Held {
   public:
    Held(Counter& counter, bool add) : counter_(&counter) {
      if (add) counter.Add(1);
    }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    ~Held() {
      if (counter_ != nullptr) counter_->Add(-1);
    }
    // Another holder gives it back (a session moved to another loop).
    void Pass() { counter_ = nullptr; }

   private:
    Counter* counter_;
  };

  void AcceptFailed(Listener listener, std::string_view reason,
                    const boost::system::error_code& ec) {
    state_->metrics
        .Get("sluice_accept_errors_total",
             {{"listener", std::string(kListenerNames[static_cast<int>(listener)])},
              {"reason", std::string(reason)}})
        ->Add();
    int64_t more = 0;
    if (!accept_log_.Due(&more)) return;
    spdlog::error(
        "event=accept_error listener={} reason={} error=\"{}\" backoff_ms={} "
        "unlogged_since_last={} note=\"logged at most once per {} s; see "
        "sluice_accept_errors_total\"",
        kListenerNames[static_cast<int>(listener)], reason, ec.message(), kAcceptBackoffMs, more,
        LogThrottle::kIntervalMs / 1000);
  }

  // A handler that threw while answering a request: the client gets a 500
  // and the connection closes; logged at most once per 10 s.
  Reply HandlerFailed(Listener listener, std::string_view what) {
    int64_t more = 0;
    if (handler_log_.Due(&more)) {
      spdlog::error(
          "event=handler_error listener={} error=\"{}\" unlogged_since_last={} note=\"the "
          "request was answered 500 and its connection closed; logged at most once per {} s\"",
          kListenerNames[static_cast<int>(listener)], what, more, LogThrottle::kIntervalMs / 1000);
    }
    return HttpAnswer::Problem(500, "internal error", "the request could not be answered");
  }

  // Refusing a request whose body is still arriving: close at once and the
  // kernel answers the unread bytes with a reset that can destroy the
  // response before the client reads it. So: stop sending, read and drop
  // what still comes, within a bound of bytes and time, then close.
  static constexpr int64_t kLingerBytes = 64 * 1024 * 1024;
  // The most of a body answered on its header that is read after the
  // answer to keep the connection (past it, the connection closes).
  static constexpr uint64_t kDrainBytes = 64 * 1024;
  // The first read of a keep-alive request (Session), and the most a read
  // of the rest asks for.
  static constexpr size_t kFirstReadBytes = 16 * 1024;
  static constexpr size_t kReadBytes = 64 * 1024;
  // What one read of a body streamed to an upstream asks for (an upload's
  // part: RestOfBody::ReadPart); read_size would offer only the room the
  // buffer has already, as little as 512 bytes a read.
  static constexpr size_t kPartBytes = 256 * 1024;

  static constexpr Duration kLingerTime = Duration::Seconds(5);

  // The problem document a request that cannot be read (or decided on) is
  // answered with.
  static HttpAnswer Refusal(int status, std::string_view detail) {
    return HttpAnswer::Problem(
        status, View(http::obsolete_reason(static_cast<http::status>(status))), detail);
  }

  // The status a request that could not be read as `ec` says is answered
  // with (431, 413 or 400) and `detail`, or 0 when it is not answered (the
  // client went, or its time ran out: `expired`).
  static int ReadFailure(const boost::system::error_code& ec, bool expired,
                         int64_t max_header_bytes, int64_t max_body_bytes, std::string& detail) {
    if (ec == http::error::header_limit) {
      detail = Cat("request header larger than ", max_header_bytes, " bytes");
      return 431;
    }
    if (ec == http::error::body_limit) {
      detail = Cat("request body larger than ", max_body_bytes, " bytes");
      return 413;
    }
    if (ec != http::error::end_of_stream && !expired && ec != net::error::connection_reset &&
        ec != net::error::eof &&
        ec.category() == http::make_error_code(http::error::bad_target).category()) {
      detail = Cat("malformed request: ", ec.message());
      return 400;
    }
    return 0;
  }

  // Bounds the body of `parser`'s request, its header read, to `most`
  // bytes in all: false when the client said more, or sent more already.
  static bool BoundBody(RequestParser& parser, int64_t most) {
    const size_t had = parser.get().body().size();
    const boost::optional<uint64_t> said = parser.content_length();
    if ((said && *said > static_cast<uint64_t>(most)) || had > static_cast<size_t>(most)) {
      return false;
    }
    parser.body_limit(static_cast<uint64_t>(most) - had);
    return true;
  }

  // Reads into `parser` from `stream`, what `buffer` holds first, until its
  // request is whole or `ec` says why not. Once the header is read and the
  // body is not all there: stops there when `decide_first(request)` says
  // so (the gateway decides the request before it reads the body); else
  // asks a client that sent "Expect: 100-continue" for the body it
  // announced (RFC 9110 section 10.1.1; curl waits a second to be asked)
  // and reads on.
  template <typename Stream, typename DecideFirst>
  static Task<void> ReadRequest(Stream& stream, beast::flat_buffer& buffer, RequestParser& parser,
                                DecideFirst decide_first, boost::system::error_code& ec) {
    bool header_seen = false;
    while (!FeedParser(parser, buffer, ec)) {
      if (!header_seen && parser.is_header_done()) {
        header_seen = true;
        if (decide_first(parser.get())) co_return;
        if (ExpectsContinue(parser.get())) {
          std::array<net::const_buffer, 2> ask = {net::buffer(kContinue), net::const_buffer()};
          if (!WriteNow(stream, ask, ec) && !ec) co_await WriteRest(stream, ask, ec);
          if (ec) co_return;
        }
      }
      const size_t got =
          co_await stream.ReadSome(buffer.prepare(beast::read_size(buffer, kReadBytes)),
                                   net::redirect_error(kUseAwaitable, ec));
      if (ec == net::error::eof) {
        EndOfInput(parser, ec);
        co_return;
      }
      if (ec) co_return;
      buffer.commit(got);
    }
  }

  // The body of a request the gateway decides on its header, read when it
  // is admitted (BodyToCome).
  enum class BodyState { kToCome, kRead, kRefused, kLost };
  template <typename Stream>
  class RestOfBody final : public BodyToCome {
   public:
    using State = BodyState;

    RestOfBody(Stream& stream, beast::flat_buffer& buffer, RequestParser& parser,
               Deadline& deadline, Duration read_timeout, int64_t max_header_bytes,
               int64_t max_body_bytes)
        : stream_(stream),
          buffer_(buffer),
          parser_(parser),
          deadline_(deadline),
          read_timeout_(read_timeout),
          max_header_bytes_(max_header_bytes),
          max_body_bytes_(max_body_bytes) {}

    Task<bool> Read(Reply& reply, int64_t most) override {
      boost::system::error_code ec;
      Limit(most, ec);
      deadline_.After(read_timeout_);
      if (!ec) {
        co_await ReadRequest(
            stream_, buffer_, parser_, [](const HttpRequest&) { return false; }, ec);
      }
      co_return Done(ec, reply);
    }

    bool Streams() override {
      if (parser_.is_done()) return false;
      const boost::optional<uint64_t> length = parser_.content_length();
      return parser_.chunked() || (length && *length > kWholeRequestBodyBytes);
    }

    std::optional<uint64_t> Length() override {
      const boost::optional<uint64_t> length = parser_.content_length();
      return length ? std::optional<uint64_t>(*length) : std::nullopt;
    }

    Task<bool> ReadPart(std::string& part, bool& end, Reply& reply) override {
      boost::system::error_code ec;
      part.clear();
      if (!asked_) {
        asked_ = true;
        if (!parser_.is_done() && ExpectsContinue(parser_.get())) {
          deadline_.After(read_timeout_);
          std::array<net::const_buffer, 2> ask = {net::buffer(kContinue), net::const_buffer()};
          if (!WriteNow(stream_, ask, ec) && !ec) co_await WriteRest(stream_, ask, ec);
          deadline_.Never();
          if (ec) co_return Done(ec, reply);
        }
      }
      // What the parser holds goes first; then one read's worth at a time.
      while (parser_.get().body().empty() && !parser_.is_done()) {
        if (!FeedParser(parser_, buffer_, ec) && !ec && parser_.get().body().empty()) {
          deadline_.After(read_timeout_);
          if (min_rate_ > 0) {
            const int64_t left_us = std::max<int64_t>(0, AllowanceUs() - waited_us_);
            deadline_.NoLaterThan(deadline_.now_ms() + (left_us + 999) / 1000);
          }
          const auto began = std::chrono::steady_clock::now();
          const size_t got = co_await stream_.ReadSome(buffer_.prepare(kPartBytes),
                                                       net::redirect_error(kUseAwaitable, ec));
          waited_us_ += std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - began)
                            .count();
          if (ec == net::error::eof) {
            EndOfInput(parser_, ec);
          } else if (!ec) {
            buffer_.commit(got);
          }
        }
        if (ec) co_return Done(ec, reply);
      }
      deadline_.Never();
      part.swap(parser_.get().body());
      parser_.get().body().clear();
      received_ += static_cast<int64_t>(part.size());
      end = parser_.is_done();
      if (end) co_return Done(ec, reply);
      co_return true;
    }

    void SetMinRate(int64_t bytes_a_second) override { min_rate_ = bytes_a_second; }
    bool TooSlow() const override { return too_slow_; }

    // kToCome: not read (the request was answered on its header); kRefused:
    // it could not be read, and the reply says why; kLost: nor that, and
    // nothing is answered.
    State state() const { return state_; }

   private:
    // At most `most` bytes of body in all: a 413 (body_limit) at once when
    // the client said more.
    void Limit(int64_t most, boost::system::error_code& ec) {
      limit_ = most;
      if (!BoundBody(parser_, most)) ec = http::error::body_limit;
    }
    // The time the floor on the rate lets the client have been waited for
    // so far: the grace of read_timeout, and a second for each min_rate_
    // bytes come. Only the waits for the client count (waited_us_): an
    // upstream slow to take the body slows the reads, not the client.
    int64_t AllowanceUs() const {
      return read_timeout_.CeilMillis() * 1000 + received_ / min_rate_ * 1000000 +
             received_ % min_rate_ * 1000000 / min_rate_;
    }
    // The reading is over, with `ec`: true when the body came whole.
    bool Done(const boost::system::error_code& ec, Reply& reply) {
      const bool expired = deadline_.expired();
      too_slow_ = expired && min_rate_ > 0 && waited_us_ >= AllowanceUs();
      deadline_.Never();
      if (!ec) {
        state_ = State::kRead;
        return true;
      }
      std::string detail;
      const int status = ReadFailure(ec, expired, max_header_bytes_, limit_, detail);
      state_ = status != 0 ? State::kRefused : State::kLost;
      if (status != 0) reply = Refusal(status, detail);
      return false;
    }

    Stream& stream_;
    beast::flat_buffer& buffer_;
    RequestParser& parser_;
    Deadline& deadline_;
    const Duration read_timeout_;
    const int64_t max_header_bytes_;
    const int64_t max_body_bytes_;
    int64_t limit_ = max_body_bytes_;  // the body's bound, for a 413's words
    bool asked_ = false;               // for its body, if it expects 100-continue
    State state_ = State::kToCome;
    int64_t min_rate_ = 0;   // bytes a second the client must keep to (SetMinRate)
    int64_t waited_us_ = 0;  // waiting for the client's parts, in all
    int64_t received_ = 0;   // bytes of body read as parts
    bool too_slow_ = false;  // cut off under min_rate_
  };

  // Whether `req` (its header read, its body not all there) from `peer_ip`
  // on `listener` is answered before its body is read, and by whom: a
  // refusal (a missing token, no such endpoint) at once; a request for the
  // gateway once decided, unless a policy with a concurrency limit matches
  // it (an admitted request would hold its slots while its body comes, and
  // a slot's lease is sized to the upstream exchange: docs/concurrency.md).
  // The decision API reads its request from the body; a TRACE's content is
  // refused, and only the whole request shows it. `set` is given the
  // policies in force it says so by, which then answer the request.
  std::optional<Answerer> AnswersOnHeader(Worker& w, Listener listener, const HttpRequest& req,
                                          const std::string& peer_ip,
                                          std::shared_ptr<const PolicySet>& set) {
    if (listener == Listener::kAdmin || req.method() == http::verb::trace) return std::nullopt;
    set = w.Current(*state_);
    const Context ctx{*state_, w, set, false, {}};
    const Answerer answerer = AnswererOf(ctx, req, listener);
    if (answerer == Answerer::kRefusal) return answerer;
    if (answerer != Answerer::kGateway) return std::nullopt;
    std::string path_storage, host;
    const RequestFacts facts =
        FactsOf(req, peer_ip, req.method_string(), req.target(), path_storage, host);
    const policy::PolicyList matching = ctx.set->Matching(facts);
    if (std::any_of(matching.begin(), matching.end(),
                    [](const policy::Policy* p) { return p->holds_slots(); }) &&
        RouteBodyBytes(*ctx.set, facts) <= ctx.set->config().server.max_body_bytes) {
      // (A route whose bodies may be larger than server.max_body_bytes
      // streams them: its slots are held while the body comes.)
      return std::nullopt;
    }
    return answerer;
  }

  // The most body `req` may have (its head read): its route's bound when
  // the gateway answers it, else server.max_body_bytes.
  int64_t OwnBodyBytes(Worker& w, const HttpRequest& req, const std::string& peer_ip,
                       Listener listener) const {
    const Context ctx{*state_, w, w.Current(*state_), false, {}};
    return BodyBytesOf(*ctx.set, req, peer_ip,
                       AnswererOf(ctx, req, listener) == Answerer::kGateway);
  }

  // The most body the route of `facts` takes (server.max_body_bytes when
  // no route has a larger one: no route is looked for then).
  static int64_t RouteBodyBytes(const PolicySet& set, const RequestFacts& facts) {
    const int64_t server = set.config().server.max_body_bytes;
    if (set.largest_body_bytes() <= server) return server;
    const RouteConfig* route = set.RouteFor(facts);
    return route != nullptr ? route->max_body_bytes.value_or(server) : server;
  }

  // The most body `req` may have: its route's for the gateway, else
  // server.max_body_bytes. `gateway`: whether the gateway answers it.
  static int64_t BodyBytesOf(const PolicySet& set, const HttpRequest& req,
                             const std::string& peer_ip, bool gateway) {
    const int64_t server = set.config().server.max_body_bytes;
    if (!gateway || set.largest_body_bytes() <= server) return server;
    std::string path_storage, host;
    const RequestFacts facts =
        FactsOf(req, peer_ip, req.method_string(), req.target(), path_storage, host);
    return RouteBodyBytes(set, facts);
  }

  Task<void> Linger(Socket& stream, Deadline& deadline) {
    boost::system::error_code ec;
    stream.shutdown(Socket::shutdown_send, ec);
    deadline.After(kLingerTime);
    int64_t dropped = 0;
    while (!ec && dropped < kLingerBytes) {
      // Dropped by the kernel, not copied out: on a TCP socket MSG_TRUNC
      // discards what it would have read (tcp(7)), so no buffer is needed.
      const ssize_t n =
          ::recv(stream.native_handle(), nullptr, static_cast<size_t>(kLingerBytes - dropped),
                 MSG_TRUNC | MSG_DONTWAIT);
      if (n > 0) {
        dropped += n;
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        break;  // the client is done, or the connection is
      } else {
        co_await stream.async_wait(Socket::wait_read, net::redirect_error(kUseAwaitable, ec));
      }
    }
  }

  // Answers a request that could not be read (or is unfit to decide on)
  // with a problem document, and the connection closes.
  template <typename Stream>
  static Task<void> Refuse(Stream& stream, Deadline& deadline, int status, std::string_view detail,
                           std::string& out, boost::system::error_code& ec) {
    Reply reply = Refusal(status, detail);
    out.clear();
    const std::string_view body = AppendHead(reply, 11, /*keep_alive=*/false, false, out);
    deadline.After(Duration::Seconds(5));
    co_await WriteRest(stream, Gathered(out, body), ec);
  }

  // With the loops on CPUs of their own (server.cpu_affinity), a connection
  // is checked every kCpuCheckEvery requests for the CPU its client now
  // sends from (SO_INCOMING_CPU: on loopback, the client thread's), and
  // moved, between two requests, to the loop on that CPU: a client thread
  // that opened its connections from one CPU and now runs on another is
  // answered where it runs, and loops stay balanced as their clients are.
  static constexpr int kCpuCheckEvery = 16;

  // The loop kept on `cpu`, or -1.
  int LoopOfCpu(int cpu) const {
    for (size_t i = 0; i < loop_cpus_.size(); ++i) {
      if (loop_cpus_[i] == cpu) return static_cast<int>(i);
    }
    return -1;
  }

  // Where a connection's requests now come from, if another loop is kept
  // there: that loop's index, else -1.
  int LoopToMoveTo(const Worker& w, Socket& stream) const {
    int cpu = -1;
    socklen_t size = sizeof cpu;
    if (getsockopt(stream.native_handle(), SOL_SOCKET, SO_INCOMING_CPU, &cpu, &size) != 0) {
      return -1;
    }
    const int to = LoopOfCpu(cpu);
    return to >= 0 && workers_[to].get() != &w ? to : -1;
  }

  // Continues a connection's session on loop `to` (its descriptor released
  // by the loop it was on, between two requests).
  void MoveSession(int to, int fd, tcp protocol, Listener listener) {
    moved_->Add();
    Worker& target = *workers_[to];
    net::post(target.ioc, [this, &target, fd, protocol, listener] {
      Socket socket(target.ioc.get_executor());
      boost::system::error_code ec;
      socket.assign(protocol, fd, ec);
      if (ec) {
        ::close(fd);
        Connections(listener).Add(-1);
        return;
      }
      net::co_spawn(target.ioc,
                    Session(target, std::move(socket), listener, nullptr, /*moved=*/true),
                    net::detached);
    });
  }

  // A connection's requests, each answered in turn, over TLS with `tls`.
  Task<void> Session(Worker& w, Socket socket, Listener listener, std::shared_ptr<tls::Context> tls,
                     bool moved = false) {
    if (tls != nullptr)
      return Converse<true>(w, std::move(socket), listener, std::move(tls), false);
    return Converse<false>(w, std::move(socket), listener, nullptr, moved);
  }

  template <bool kTls>
  Task<void> Converse(Worker& w, Socket socket, Listener listener,
                      std::shared_ptr<tls::Context> tls, bool moved) {
    Metrics& metrics = state_->metrics;
    Held connection(Connections(listener), /*add=*/!moved);
    boost::system::error_code ec;
    const tcp::endpoint peer = socket.remote_endpoint(ec);
    std::string peer_ip = ec ? "" : peer.address().to_string();
    if (peer.address().is_v6() && peer.address().to_v6().is_v4_mapped()) {
      peer_ip = net::ip::make_address_v4(net::ip::v4_mapped, peer.address().to_v6()).to_string();
    }
    Deadline deadline(w, socket);
    StreamOf<kTls> stream = OpenStream<kTls>(socket, tls.get());
    std::string out;          // the head of each response (its capacity kept)
    std::string client_cert;  // the subject of the client's verified certificate
    if constexpr (kTls) {
      // TLS writes several records in a row (the handshake's flights, the
      // session tickets, then the answer): without TCP_NODELAY the answer
      // waited for the client's delayed ACK of the tickets (Nagle), about
      // 40 ms a new connection. A plain answer is one write: left as is.
      socket.set_option(tcp::no_delay(true), ec);
      // The handshake has the time of a request; a client that does not
      // finish it is counted, and its connection closed.
      deadline.After(w.Current(*state_)->config().server.read_timeout);
      if (co_await PlainToTls(socket, ec)) {
        // As NGINX does: a plain request is told where it went, in plain.
        TlsHandshakeFailed(listener, false)->Add();
        Responses(listener, 400)->Add();
        co_await Refuse(socket, deadline, 400, "a plain HTTP request to a TLS (https) listener",
                        out, ec);
        if (!ec) co_await Linger(socket, deadline);  // its request unread
        co_return;
      }
      if (!ec) co_await stream.Handshake(ec);
      if (ec) {
        TlsHandshakeFailed(listener, deadline.expired())->Add();
        co_return;
      }
      client_cert = stream.ClientSubject();
    }
    beast::flat_buffer buffer;
    bool first = !moved;
    // A TLS session stays in its loop (its state is not a descriptor).
    const bool may_move = !kTls && !loop_cpus_.empty() && listener != Listener::kAdmin;
    int requests = 0;
    bool moved_on = false;
    for (;;) {
      // Limits and timeouts come from the config in force, so a reload
      // changes them for the next request. (Copied: the read suspends.)
      const int64_t max_header_bytes = w.Current(*state_)->config().server.max_header_bytes;
      const int64_t max_body_bytes = w.Current(*state_)->config().server.max_body_bytes;
      const Duration read_timeout = w.Current(*state_)->config().server.read_timeout;
      const Duration idle_timeout = w.Current(*state_)->config().server.idle_timeout;
      if (!first && buffer.size() == 0 && may_move && requests % kCpuCheckEvery == 1 &&
          !state_->draining.load()) {
        // Nothing in flight and nothing buffered: the session can move.
        if (const int to = LoopToMoveTo(w, socket); to >= 0) {
          const tcp protocol = socket.local_endpoint(ec).protocol();
          const int fd = ec ? -1 : socket.release(ec);
          if (!ec && fd >= 0) {
            MoveSession(to, fd, protocol, listener);
            moved_on = true;
            break;
          }
          ec = {};
        }
      }
      if (!first && buffer.size() == 0) {
        // Between keep-alive requests the wait for the next one is governed
        // by idle_timeout; read_timeout starts with its first byte. The
        // wait is a read into the request's buffer, not an async_wait:
        // Asio arms epoll (an epoll_ctl call) for every wait, and for a
        // read only when the last read left bytes behind (one system call
        // a request fewer: bench/README.md, "HTTP").
        deadline.After(idle_timeout);
        const size_t got = co_await stream.ReadSome(buffer.prepare(kFirstReadBytes),
                                                    net::redirect_error(kUseAwaitable, ec));
        if (ec) break;
        buffer.commit(got);
      }
      first = false;
      RequestParser parser;
      parser.header_limit(static_cast<uint32_t>(max_header_bytes));
      // The gateway's routes may take larger bodies (routes[].max_body_bytes,
      // streamed): the largest until the request's own is known.
      const int64_t largest_body = listener == Listener::kGateway
                                       ? w.Current(*state_)->largest_body_bytes()
                                       : max_body_bytes;
      parser.body_limit(static_cast<uint64_t>(largest_body));
      int64_t body_bytes = max_body_bytes;  // the request's own bound
      bool too_large = false;               // its body, said or come, is past it
      deadline.After(read_timeout);         // a slow client gets this long for a whole request
      // What http::async_read does, without its composed operation, which
      // costs a trip through the loop's queue even when the request is
      // already in the buffer (it was, whole, for most requests): the
      // parser gets what the buffer holds, and the socket is read only
      // when it wants more.
      ec = {};
      // Set when the request is answered before its body is all read.
      std::optional<Answerer> on_header;
      std::shared_ptr<const PolicySet> header_set;  // the policies it said so by
      if (!FeedParser(parser, buffer, ec)) {
        co_await ReadRequest(
            stream, buffer, parser,
            [&](const HttpRequest& r) {
              on_header = AnswersOnHeader(w, listener, r, peer_ip, header_set);
              if (largest_body > max_body_bytes) {
                body_bytes =
                    BodyBytesOf(*w.Current(*state_), r, peer_ip, on_header == Answerer::kGateway);
                too_large = !BoundBody(parser, body_bytes);
                if (too_large) return true;
              }
              return on_header.has_value();
            },
            ec);
      } else if (!ec && largest_body > max_body_bytes) {
        // Whole at once: its body, already read, against its own bound.
        body_bytes = OwnBodyBytes(w, parser.get(), peer_ip, listener);
        too_large = parser.get().body().size() > static_cast<size_t>(body_bytes);
      }
      if (ec == http::error::body_limit && largest_body > max_body_bytes &&
          !parser.is_header_done()) {
        // Said longer than every route's bound, and refused as its head was
        // parsed (its fields are all in): the 413 names its own bound.
        body_bytes = OwnBodyBytes(w, parser.get(), peer_ip, listener);
      }
      if (too_large) {
        const std::string detail = Cat("request body larger than ", body_bytes, " bytes");
        co_await Refuse(stream, deadline, 413, detail, out, ec);
        Responses(listener, 413)->Add();
        if (!ec) co_await Linger(socket, deadline);
        break;
      }
      const bool body_to_come = on_header.has_value();
      if (ec) {
        std::string detail;
        const int status =
            ReadFailure(ec, deadline.expired(), max_header_bytes, body_bytes, detail);
        if (status != 0) {
          co_await Refuse(stream, deadline, status, detail, out, ec);
          Responses(listener, status)->Add();
          if (!ec) co_await Linger(socket, deadline);
        }
        break;
      }
      Request& req = parser.get();
      ++requests;
      if (std::optional<std::string> bad = Malformed(req)) {
        co_await Refuse(stream, deadline, 400, *bad, out, ec);
        Responses(listener, 400)->Add();
        if (!ec && body_to_come) co_await Linger(socket, deadline);
        break;
      }
      RestOfBody<StreamOf<kTls>> rest(stream, buffer, parser, deadline, read_timeout,
                                      max_header_bytes, body_bytes);
      std::optional<Held> in_flight(std::in_place, metrics.in_flight(), true);
      deadline.Never();
      // Read before the request goes to an endpoint: the gateway rewrites
      // it for the upstream.
      const unsigned version = req.version();
      const bool head = req.method() == http::verb::head;
      bool keep_alive = req.keep_alive();
      const bool expects_continue = body_to_come && ExpectsContinue(req);
      // (No co_await inside ?: : g++ 12 miscompiles it.)
      Reply reply;
      try {
        Context ctx{*state_, w, on_header ? std::move(header_set) : w.Current(*state_), kTls,
                    client_cert};
        if (listener == Listener::kAdmin) {
          reply = co_await AdminEndpoint(ctx, req.method_string(), req.target(), req.body());
        } else if (on_header == Answerer::kGateway) {
          co_await Gateway(ctx, req, peer_ip, reply, &rest);
        } else {
          switch (DispatchNow(ctx, req, peer_ip, listener, reply)) {
            case Routed::kAnswered:
              break;
            case Routed::kGateway:
              co_await Gateway(ctx, req, peer_ip, reply);
              break;
            case Routed::kLater:
              co_await Dispatch(ctx, req, peer_ip, listener, reply);
              break;
          }
        }
      } catch (const std::exception& e) {
        reply = HandlerFailed(listener, e.what());
        keep_alive = false;
      }
      // A body not read (the request was answered on its header, or could
      // not be read) leaves the connection without a next request to read,
      // unless it is a short rest of known length the client sends unasked:
      // that is read after the answer, and dropped, as NGINX does, so that
      // a client (or a proxy in front) keeps its connection.
      const bool unread = body_to_come && rest.state() != BodyState::kRead;
      if (unread && rest.state() == BodyState::kLost) break;
      const bool drain = unread && keep_alive && rest.state() == BodyState::kToCome &&
                         !expects_continue && parser.content_length_remaining() &&
                         *parser.content_length_remaining() <= kDrainBytes;
      if (state_->draining.load() || (unread && !drain)) keep_alive = false;
      const int status = StatusOf(reply);
      Responses(listener, status)->Add();
      const ServerConfig& sc = w.Current(*state_)->config().server;
      if (sc.access_log) {
        spdlog::info("event=access listener={} peer={} method={} target=\"{}\" status={}",
                     kListenerNames[static_cast<int>(listener)], peer_ip, req.method_string(),
                     req.target(), status);
      }
      deadline.After(sc.read_timeout);
      out.clear();
      const std::string_view body = AppendHead(reply, version, keep_alive, head, out);
      std::array<net::const_buffer, 2> answer = Gathered(out, body);
      if (!WriteNow(stream, answer, ec) && !ec) co_await WriteRest(stream, answer, ec);
      Relayed* relayed = std::get_if<Relayed>(&reply);
      if (relayed != nullptr && relayed->after != nullptr && relayed->body_to_come) {
        // The body goes as it comes; the connection ends with a body cut
        // short, or one the connection's end ends (HTTP/1.0).
        const Duration route_timeout = relayed->after->timeout;
        const bool whole =
            !ec && co_await StreamBody(
                       w, stream, socket, deadline, *relayed,
                       route_timeout > Duration::Zero() ? route_timeout : sc.upstream_timeout,
                       sc.read_timeout);
        if (!whole || !relayed->answer.keep_alive) keep_alive = false;
        if (!whole) ec = net::error::connection_aborted;
      } else if (relayed != nullptr && relayed->after != nullptr) {
        // A WebSocket: the connection is a tunnel now, a request in flight
        // until it ends (a drain shuts it), and then it is over. One that
        // opens as a drain begins is not begun.
        if (!ec && !state_->draining.load()) {
          const Duration route_idle = relayed->after->idle;
          co_await RunTunnel(w, stream, socket, deadline, buffer, *relayed->after,
                             route_idle > Duration::Zero() ? route_idle : idle_timeout);
        }
        break;
      }
      in_flight.reset();
      if (!ec && unread && !keep_alive) co_await Linger(socket, deadline);
      if (!ec && drain && keep_alive) {
        deadline.After(read_timeout);
        co_await ReadRequest(
            stream, buffer, parser, [](const HttpRequest&) { return false; }, ec);
      }
      if (ec || !keep_alive) break;
    }
    if (moved_on) {
      connection.Pass();  // the session goes on in another loop
      co_return;
    }
    if constexpr (kTls) stream.Close();  // close_notify: the answer was not cut short
    socket.shutdown(Socket::shutdown_send, ec);
  }

  // Whether what a client sent first to a TLS listener is plain HTTP: its
  // first byte, once one came, is not a TLS handshake record's (22) but a
  // letter (a method's). It stays in the socket for the handshake to read.
  static Task<bool> PlainToTls(Socket& socket, boost::system::error_code& ec) {
    co_await socket.async_wait(Socket::wait_read, net::redirect_error(kUseAwaitable, ec));
    if (ec) co_return false;
    unsigned char first = 0;
    const ssize_t n = ::recv(socket.native_handle(), &first, 1, MSG_PEEK | MSG_DONTWAIT);
    co_return n == 1 && ((first >= 'A' && first <= 'Z') || (first >= 'a' && first <= 'z'));
  }

  // sluice_tls_handshake_failures_total of `listener`: `expired`, the
  // client did not finish in time; else it failed (no common version or
  // cipher, a certificate refused or missing, plain HTTP to the port).
  Counter* TlsHandshakeFailed(Listener listener, bool expired) {
    return state_->metrics.Get(
        "sluice_tls_handshake_failures_total",
        {{"listener", std::string(kListenerNames[static_cast<int>(listener)])},
         {"reason", expired ? "timeout" : "failed"}});
  }

  // A new config from the source: its policies (and Envoy rules) built
  // beside the ones in force, which keep their state where their limits did
  // not change, then swapped in. Runs on the source's thread.
  absl::Status Apply(const Config& next) {
    const Config& started = state_->config;
    if (next.server.listen != started.server.listen || next.server.admin != started.server.admin ||
        next.server.threads != started.server.threads ||
        next.server.cpu_affinity != started.server.cpu_affinity ||
        next.server.decision.listen != started.server.decision.listen) {
      spdlog::warn(
          "event=reload note=\"changes to server.listen, server.admin, server.threads, "
          "server.cpu_affinity and server.decision.listen take effect at the next start; the "
          "other server settings apply now\"");
    }
    // store.redis.tls's files are read again below; the rest of store waits.
    auto but_tls = [](StoreConfig store) {
      if (store.redis.has_value()) store.redis->tls = RedisTls{.enabled = store.redis->tls.enabled};
      return store;
    };
    if (but_tls(next.store) != but_tls(started.store)) {
      spdlog::warn(
          "event=reload note=\"changes to store take effect at the next start, but for "
          "store.redis.tls's files\"");
    }
    absl::StatusOr<std::shared_ptr<const PolicySet>> set =
        PolicySet::Create(next, state_->store, state_->redis.get(), *state_->clock,
                          state_->policies.load().get(), state_->metrics);
    if (!set.ok()) return set.status();
    // The Envoy RLS rules of the new config, built before anything is swapped in.
    absl::StatusOr<std::shared_ptr<const envoy::RlsServer::Snapshot>> rls_next = nullptr;
    if (state_->rls != nullptr) rls_next = state_->rls->Prepare(next);
    if (!rls_next.ok()) return rls_next.status();
    // A renewed certificate: the connections made from now on use it. A
    // file that cannot be used fails the reload, and nothing changes.
    if (state_->redis != nullptr && next.store.redis.has_value()) {
      if (absl::Status tls = state_->redis->ReloadTls(next.store.redis->tls); !tls.ok()) return tls;
    }
    if (absl::Status tls = LoadTls(next); !tls.ok()) return tls;
    state_->Publish(*std::move(set));
    if (state_->rls != nullptr) state_->rls->Swap(*std::move(rls_next));
    ShowErrorSeries(next);
    return absl::OkStatus();
  }

  // server.tls and server.decision.tls, their files read now, for the
  // connections accepted from now on, and the routes' https upstreams', for
  // the connections made from now on; nothing changes when one fails.
  absl::Status LoadTls(const Config& config) {
    absl::StatusOr<std::shared_ptr<tls::Context>> gateway =
        ListenerContext(config.server.tls, "server.tls");
    if (!gateway.ok()) return gateway.status();
    absl::StatusOr<std::shared_ptr<tls::Context>> decision =
        ListenerContext(config.server.decision.tls, "server.decision.tls");
    if (!decision.ok()) return decision.status();
    absl::StatusOr<std::shared_ptr<UpstreamContexts>> upstreams = MakeUpstreamContexts(config);
    if (!upstreams.ok()) return upstreams.status();
    state_->gateway_tls.store(*std::move(gateway));
    state_->decision_tls.store(*std::move(decision));
    state_->upstream_tls.store(*std::move(upstreams));
    return absl::OkStatus();
  }

  // ---- operations ----

  // Moves the loop's coarse clock and cancels the I/O of connections past
  // their deadline (see Deadline).
  Task<void> Sweep(Worker& w) {
    Timer timer(w.ioc.get_executor());
    for (;;) {
      timer.expires_after(std::chrono::milliseconds(Deadline::kSweepMs));
      boost::system::error_code ec;
      co_await timer.async_wait(net::redirect_error(kUseAwaitable, ec));
      if (ec) co_return;
      w.now_ms = Worker::SteadyMs();
      // Check only cancels; handlers run later, so the list is stable here.
      for (Deadline* d : w.deadlines) d->Check(w.now_ms);
      // The slots of tunnels and streamed bodies keep their leases while
      // they go on, quiet or not (each renews a third of its lease apart).
      if (!w.tunnels.empty()) {
        const Time now = state_->clock->Now();
        for (Worker::TunnelEnds* t : w.tunnels) {
          if (t->slots != nullptr) t->slots->Renew(now);
        }
      }
    }
  }

  // Each policy's decisions in the second just ended, at every whole second
  // of the wall clock (DecisionSeries).
  Task<void> SampleSeries(Worker& w) {
    Timer timer(w.ioc.get_executor());
    for (;;) {
      const int64_t unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
      timer.expires_after(std::chrono::milliseconds(1000 - unix_ms % 1000));
      boost::system::error_code ec;
      co_await timer.async_wait(net::redirect_error(kUseAwaitable, ec));
      if (ec) co_return;
      state_->series.Sample(*w.Current(*state_), (unix_ms / 1000 + 1) * 1000);
    }
  }

  Task<void> Drain() {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::microseconds(state_->config.server.drain_timeout.micros());
    Timer timer(workers_[0]->ioc.get_executor());
    while (state_->metrics.in_flight().value() > 0 && std::chrono::steady_clock::now() < deadline) {
      timer.expires_after(std::chrono::milliseconds(20));
      boost::system::error_code ec;
      co_await timer.async_wait(net::redirect_error(kUseAwaitable, ec));
    }
    const auto relaying = [this] {
      int n = 0;
      for (const auto& w : workers_) n += w->relaying.load(std::memory_order_relaxed);
      return n;
    };
    if (state_->metrics.in_flight().value() > 0) {
      spdlog::warn("event=drain result=deadline in_flight={}", state_->metrics.in_flight().value());
    }
    if (relaying() > 0) {
      // Bodies still streaming are cut now, so that their requests end (and
      // give back what they hold) while the stores are there.
      for (auto& w : workers_) {
        net::post(w->ioc, [w = w.get()] { w->ShutRelays(/*bodies=*/true); });
      }
      const auto cut = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (relaying() > 0 && std::chrono::steady_clock::now() < cut) {
        timer.expires_after(std::chrono::milliseconds(20));
        boost::system::error_code ec;
        co_await timer.async_wait(net::redirect_error(kUseAwaitable, ec));
      }
    }
    for (auto& w : workers_) w->ioc.stop();
  }

  ConfigSource& source_;
  std::unique_ptr<ServerState> state_;
  const LifecycleHook lifecycle_;
  std::mutex lifecycle_mu_;
  bool stopping_told_ = false;  // guarded by lifecycle_mu_
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<Acceptor> admin_acceptor_;
  std::vector<int> loop_cpus_;  // the CPU of each loop (LoopCpus), or none
  Counter* moved_ = nullptr;    // sluice_connections_moved_total
  uint16_t port_ = 0;
  uint16_t admin_port_ = 0;
  uint16_t decision_port_ = 0;
  int64_t open_files_ = 0;        // RLIMIT_NOFILE, once raised
  int64_t file_cap_ = INT64_MAX;  // connections per listener the file limit leaves room for
  // sluice_http_responses_total by listener and code, and
  // sluice_accept_errors_total, cached (see Responses, AcceptFailed).
  std::array<std::array<std::atomic<Counter*>, 600>, kListeners> responses_{};
  LogThrottle accept_log_;   // AcceptFailed
  LogThrottle handler_log_;  // HandlerFailed
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(ConfigSource& source,
                                                       ServerOptions options) {
  auto server = std::make_unique<ServerImpl>(
      source, options.clock != nullptr ? options.clock : &SystemClock::Default(),
      std::move(options.lifecycle));
  if (absl::Status s = server->Init(); !s.ok()) return s;
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace sluice::server
