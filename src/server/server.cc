// The HTTP side of `sluice serve`. All Beast code lives in this file: Beast
// is header-only and slow to compile, so it is kept to one translation unit.
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include "server/server.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <list>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "base/cat.h"
#include "envoy/rls_server.h"
#include "nlohmann/json.hpp"
#include "server/beast_request.h"
#include "policy/evaluation.h"
#include "policy/headers.h"
#include "metrics/metrics.h"
#include "policy/policy_set.h"
#include "policy/request_text.h"
#include "spdlog/spdlog.h"
#include "sluice/store/memory_store.h"
#include "sluice/store/redis_store.h"

namespace sluice::server {
namespace {

// The policy layer and the metrics, as the server names them.
using metrics::Counter;
using metrics::Histogram;
using metrics::Metrics;
using policy::AppendJsonString;
using policy::AppendRateLimitHeaders;
using policy::BearerTokenIn;
using policy::ClientIp;
using policy::ErrorBody;
using policy::FlatCheck;
using policy::HostName;
using policy::JsonDepthWithin;
using policy::kMaxJsonDepth;
using policy::NormalizePath;
using policy::ParseFlatCheck;
using policy::PercentDecode;
using policy::Policy;
using policy::PolicyAnswer;
using policy::PolicySet;
using policy::ProblemBody;
using policy::RequestFacts;
using policy::RetryAfterSeconds;
using policy::TargetAuthority;
using policy::TargetPath;

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using internal::Cat;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;
using HeaderList = std::vector<std::pair<std::string, std::string>>;
// Every object is bound to its thread's io_context by its concrete executor
// type; the type-erased default (any_io_executor) cost ~5% of a request in
// copies and virtual calls.
using Executor = net::io_context::executor_type;
template <typename T>
using Task = net::awaitable<T, Executor>;
using Socket = net::basic_stream_socket<tcp, Executor>;
using Acceptor = net::basic_socket_acceptor<tcp, Executor>;
using Timer = net::basic_waitable_timer<std::chrono::steady_clock,
                                        net::wait_traits<std::chrono::steady_clock>, Executor>;
using Resolver = net::ip::basic_resolver<tcp, Executor>;

constexpr net::use_awaitable_t<Executor> kUseAwaitable;

// Keys of a valid config that are read and not acted on, logged at `event`.
void LogWarnings(std::string_view event, const Config& config) {
  for (const std::string& line : ConfigWarnings(config)) {
    spdlog::warn("event={} note=\"{}\"", event, line);
  }
}

// Awaits an answer that arrives by callback on another thread (a Redis
// decision): `start(done)` begins the work; the coroutine resumes on
// `ioc`, its own loop, with what `done` was given.
template <typename T, typename Start>
Task<T> Await(net::io_context& ioc, Start start) {
  return net::async_initiate<const net::use_awaitable_t<Executor>, void(T)>(
      [&ioc, start = std::move(start)](auto handler) mutable {
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        start([h, &ioc](T value) {
          net::post(ioc, [h, value = std::move(value)]() mutable { (*h)(std::move(value)); });
        });
      },
      kUseAwaitable);
}

// The verdict of the policies that apply to a request: at once when all of
// them are in this process, suspending for the round trip when some are in
// Redis.
Task<policy::Verdict> EvaluateOn(net::io_context& ioc, const std::vector<policy::Applied>& applied,
                                 Time now) {
  if (policy::InProcess(applied)) co_return policy::EvaluateNow(applied, now);
  policy::Verdict verdict = co_await Await<policy::Verdict>(ioc, [&](policy::VerdictCallback done) {
    policy::Evaluate(applied, now, std::move(done));
  });
  co_return verdict;
}

Response MakeResponse(int status, unsigned version, bool keep_alive, std::string body,
                      std::string_view content_type, const HeaderList& headers = {}) {
  Response res{static_cast<http::status>(status), version};
  res.set(http::field::server, "sluice");
  if (!body.empty() || status != 204) {
    res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
  }
  for (const auto& [name, value] : headers) res.set(name, value);
  res.body() = std::move(body);
  res.keep_alive(keep_alive);
  res.prepare_payload();
  return res;
}

// Which listener a connection came in on. The decision API spends any
// key's quota, so where it is served is the operator's choice (see
// DecisionConfig); the admin listener answers only GETs.
enum class Listener { kGateway, kDecision, kAdmin };
constexpr int kListeners = 3;
constexpr std::string_view kListenerNames[kListeners] = {"main", "decision", "admin"};

Response Problem(int status, const Request& req, std::string_view title, std::string_view detail) {
  return MakeResponse(status, req.version(), req.keep_alive(), ErrorBody(status, title, detail),
                      "application/problem+json");
}

// Shared by every thread.
struct Shared {
  Config config;  // as loaded at start (listeners, threads, limits of the process)
  std::string config_path;
  const Clock* clock;
  MemoryStore store;
  std::unique_ptr<RedisStore> redis;  // store.redis: the shared store of global limits
  Metrics metrics;
  std::atomic<std::shared_ptr<const PolicySet>> policies;
  // Bumped after each store to `policies`: event loops compare it with the
  // version they cached instead of loading the shared_ptr (whose reference
  // count would be one more cache line shared by every request).
  std::atomic<uint64_t> policies_version{0};
  std::atomic<bool> draining{false};
  std::mutex reload_mu;
  Counter* reloads_ok;
  Counter* reloads_failed;
  // grpc.listen: the Envoy rate limit service (src/envoy/). Declared after
  // the stores and metrics it uses, so destroyed before them.
  std::unique_ptr<envoy::RlsServer> rls;

  Shared(Config c, std::string path, const Clock* clk)
      : config(std::move(c)), config_path(std::move(path)), clock(clk),
        store(MemoryStoreOptions{.max_keys = config.store.max_keys}) {
    reloads_ok = metrics.Get("sluice_config_reloads_total", {{"result", "success"}});
    reloads_failed = metrics.Get("sluice_config_reloads_total", {{"result", "failure"}});
    metrics.SetHelp("sluice_config_reloads_total", "Config reloads, by result.");
    metrics.SetHelp("sluice_decisions_total", "Decisions, by policy and outcome.");
    metrics.SetHelp("sluice_upstream_errors_total", "Failed upstream exchanges, by route and kind.");
    metrics.SetHelp("sluice_http_responses_total", "Responses sent, by listener and status code.");
    metrics.AddGauge("sluice_keys", "Keys held by the memory store.", "gauge",
                     [this] { return store.stats().keys; });
    metrics.AddGauge("sluice_forced_evictions_total",
                     "Keys evicted while not fresh because max_keys was reached.", "counter",
                     [this] { return store.stats().forced_evictions; });
    metrics.AddGauge("sluice_fresh_evictions_total",
                     "Keys dropped because their state was back to fresh.", "counter",
                     [this] { return store.stats().fresh_evictions; });
  }

  // sluice_http_responses_total, one cached counter per listener and code.
  Counter* Responses(Listener listener, int code) {
    if (code < 100 || code > 599) code = 599;
    const int l = static_cast<int>(listener);
    std::atomic<Counter*>& slot = responses_[l][code];
    Counter* c = slot.load(std::memory_order_acquire);
    if (c == nullptr) {
      c = metrics.Get("sluice_http_responses_total", {{"listener", std::string(kListenerNames[l])},
                                                      {"code", std::to_string(code)}});
      slot.store(c, std::memory_order_release);
    }
    return c;
  }
  std::array<std::array<std::atomic<Counter*>, 600>, kListeners> responses_{};

  // Out of file descriptors (or socket memory), accept fails at once for as
  // long as the condition lasts: logged at most once per interval, counted.
  Counter* AcceptErrors(Listener listener, std::string_view reason) {
    return metrics.Get("sluice_accept_errors_total",
                       {{"listener", std::string(kListenerNames[static_cast<int>(listener)])},
                        {"reason", std::string(reason)}});
  }
  std::atomic<int64_t> accept_error_logged_ms{INT64_MIN / 2};
  std::atomic<int64_t> accept_errors_unlogged{0};

  // The verdict of `applying` on a request (`set`, which they came from, is
  // held by the caller for the whole request, so a reload cannot pull it
  // away midway). `applied` is filled here and must outlive the call.
  Task<policy::Verdict> Evaluate(net::io_context& ioc, const PolicySet& set,
                                 const std::vector<const Policy*>& applying,
                                 const RequestFacts& facts, std::string_view route,
                                 std::vector<policy::Applied>& applied) {
    const auto start = std::chrono::steady_clock::now();
    applied.reserve(applying.size());
    for (const Policy* p : applying) {
      applied.push_back({.policy = p,
                         .key = p->KeyFor(facts, route, set.config().trusted_proxies,
                                          set.config().real_ip_header)});
    }
    policy::Verdict verdict = co_await EvaluateOn(ioc, applied, clock->Now());
    metrics.decision_latency().Observe(std::chrono::duration_cast<std::chrono::microseconds>(
                                           std::chrono::steady_clock::now() - start)
                                           .count());
    co_return verdict;
  }

  absl::Status Reload(std::string_view why) {
    std::lock_guard lock(reload_mu);
    absl::StatusOr<Config> next = LoadConfigFile(config_path, {.allow_empty = false});
    if (!next.ok()) {
      reloads_failed->Add();
      spdlog::error("event=reload result=failure trigger={} error=\"{}\"", why,
                    std::string(next.status().message()));
      return next.status();
    }
    if (next->server.listen != config.server.listen || next->server.admin != config.server.admin ||
        next->server.threads != config.server.threads ||
        next->server.decision.listen != config.server.decision.listen) {
      spdlog::warn("event=reload note=\"changes to server.listen, server.admin, server.threads and "
                   "server.decision.listen take effect at the next start; the other server "
                   "settings apply now\"");
    }
    if (next->store != config.store) {
      spdlog::warn("event=reload note=\"changes to store take effect at the next start\"");
    }
    LogWarnings("reload", *next);
    absl::StatusOr<std::shared_ptr<const PolicySet>> set =
        PolicySet::Create(*next, store, redis.get(), *clock, policies.load().get(), metrics);
    if (!set.ok()) {
      reloads_failed->Add();
      spdlog::error("event=reload result=failure trigger={} error=\"{}\"", why,
                    std::string(set.status().message()));
      return set.status();
    }
    // The Envoy RLS rules of the new config, built before anything is swapped in.
    absl::StatusOr<std::shared_ptr<const envoy::RlsServer::Snapshot>> rls_next = nullptr;
    if (rls != nullptr) rls_next = rls->Prepare(*next);
    if (!rls_next.ok()) {
      reloads_failed->Add();
      spdlog::error("event=reload result=failure trigger={} error=\"{}\"", why,
                    std::string(rls_next.status().message()));
      return rls_next.status();
    }
    policies.store(*std::move(set));
    policies_version.fetch_add(1, std::memory_order_release);
    if (rls != nullptr) rls->Swap(*std::move(rls_next));
    reloads_ok->Add();
    spdlog::info("event=reload result=success trigger={} policies={}", why, next->policies.size());
    return absl::OkStatus();
  }
};

// Idle keep-alive connections to upstreams, per thread (no locking).
class UpstreamPool {
 public:
  std::optional<Socket> Take(const HostPort& upstream) {
    auto it = idle_.find(Key(upstream));
    if (it == idle_.end() || it->second.empty()) return std::nullopt;
    Socket socket = std::move(it->second.back());
    it->second.pop_back();
    return socket;
  }
  void Give(const HostPort& upstream, Socket socket) {
    auto& list = idle_[Key(upstream)];
    if (list.size() < 64) list.push_back(std::move(socket));
  }

 private:
  static std::string Key(const HostPort& hp) { return Cat(hp.host, ":", hp.port); }
  std::map<std::string, std::vector<Socket>> idle_;
};

struct Worker;

// Timeouts without a timer per operation. Arming a timer for every read and
// write (what beast::tcp_stream does) costs a timerfd system call each, more
// than deciding the request. Instead each connection keeps a deadline in its
// loop's coarse clock, and a sweep every kSweepMs cancels the I/O of
// connections past theirs: a timeout fires between its time and two sweeps
// (200 ms) later.
class Deadline {
 public:
  static constexpr int64_t kSweepMs = 100;

  Deadline(Worker& w, Socket& socket);
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  void After(Duration d);
  void Never() { at_ms_ = INT64_MAX; }
  // The pending operation was cancelled because the deadline passed.
  bool expired() const { return expired_; }

  // Called by the sweep.
  void Check(int64_t now_ms) {
    if (now_ms < at_ms_) return;
    at_ms_ = INT64_MAX;
    expired_ = true;
    boost::system::error_code ignored;
    socket_.cancel(ignored);
  }

 private:
  Worker& worker_;
  Socket& socket_;
  int64_t at_ms_ = INT64_MAX;
  bool expired_ = false;
  std::list<Deadline*>::iterator self_;
};

struct Worker {
  // The config in force as this loop last saw it (see Shared::policies_version).
  std::shared_ptr<const PolicySet> policies;
  uint64_t policies_version = UINT64_MAX;
  // Declared before `ioc`, so destroyed after it: coroutines still parked in
  // the loop at shutdown unregister their deadlines as `ioc` destroys them.
  std::list<Deadline*> deadlines;
  net::io_context ioc{1};
  std::unique_ptr<Acceptor> acceptor;
  std::unique_ptr<Acceptor> decision_acceptor;  // server.decision.listen, when set
  UpstreamPool pool;
  std::mt19937_64 rng{std::random_device{}()};
  // The loop's coarse clock (steady, milliseconds), moved by the sweep.
  int64_t now_ms = SteadyMs();

  static int64_t SteadyMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

Deadline::Deadline(Worker& w, Socket& socket) : worker_(w), socket_(socket) {
  self_ = w.deadlines.insert(w.deadlines.end(), this);
}
Deadline::~Deadline() { worker_.deadlines.erase(self_); }
void Deadline::After(Duration d) {
  expired_ = false;
  // now_ms lags the real time by up to one sweep: adding one sweep makes the
  // timeout never shorter than asked (and at most two sweeps longer).
  at_ms_ = worker_.now_ms + d.CeilMillis() + kSweepMs;
}

class ServerImpl final : public Server {
 public:
  ServerImpl(Config config, std::string path, const Clock* clock)
      : shared_(std::make_shared<Shared>(std::move(config), std::move(path), clock)) {}

  // Every connection holds a file descriptor. The soft limit is often far
  // below what the hard limit allows (1024 against 524288 under systemd), so
  // it is raised to the hard one, as NGINX's worker_rlimit_nofile would; the
  // connection limits should then leave room for the rest (Redis, upstreams,
  // the config file, the admin listener), or a flood of connections starves
  // everything else, /metrics included.
  static constexpr int64_t kReservedFiles = 64;

  void FitFileLimit() {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
    if (limit.rlim_cur < limit.rlim_max) {
      rlimit raised = limit;
      raised.rlim_cur = limit.rlim_max == RLIM_INFINITY ? std::max<rlim_t>(limit.rlim_cur, 1 << 20)
                                                         : limit.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
    }
    open_files_ = limit.rlim_cur == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(limit.rlim_cur);
    // What client connections may hold: all but the reserve and the gRPC
    // listener's own cap, shared by the gateway and decision listeners, two
    // descriptors each when a gateway connection can hold an upstream
    // connection too.
    const ServerConfig& sc = shared_->config.server;
    const int64_t listeners = sc.decision.listen ? 2 : 1;
    const int64_t per_connection = shared_->config.routes.empty() ? 1 : 2;
    const int64_t grpc = shared_->config.grpc ? shared_->config.grpc->max_connections : 0;
    file_cap_ = std::max<int64_t>(
        1, (open_files_ - kReservedFiles - std::min(grpc, open_files_ / 2)) / listeners /
               per_connection);
    if (sc.max_connections > file_cap_) {
      spdlog::warn("event=start note=\"server.max_connections ({}) does not fit the open file "
                   "limit ({}): connections per listener are capped at {}, keeping {} descriptors "
                   "for the rest (upstreams, Redis, the admin listener); raise the limit (ulimit "
                   "-n, LimitNOFILE) to allow more\"",
                   sc.max_connections, open_files_, file_cap_, kReservedFiles);
    }
  }

  absl::Status Init() {
    // Taken before the config was read can be trusted: a change written
    // from here on is seen by the watcher.
    initial_stamp_ = ConfigStamp();
    FitFileLimit();
    if (shared_->config.store.redis) {
      absl::StatusOr<std::unique_ptr<RedisStore>> redis =
          RedisStore::Connect(*shared_->config.store.redis, [](bool warning, std::string_view line) {
            if (warning) {
              spdlog::warn("{}", line);
            } else {
              spdlog::info("{}", line);
            }
          });
      if (!redis.ok()) {
        return absl::Status(redis.status().code(), Cat("store.redis: ", redis.status().message()));
      }
      shared_->redis = *std::move(redis);
      AddStoreMetrics();
    }
    absl::StatusOr<std::shared_ptr<const PolicySet>> set =
        PolicySet::Create(shared_->config, shared_->store, shared_->redis.get(), *shared_->clock,
                          nullptr, shared_->metrics);
    if (!set.ok()) return set.status();
    shared_->policies.store(*set);
    shared_->policies_version.fetch_add(1, std::memory_order_release);
    int threads = shared_->config.server.threads;
    if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 0; i < threads; ++i) workers_.push_back(std::make_unique<Worker>());
    // Main listener: one SO_REUSEPORT acceptor per loop.
    HostPort listen = shared_->config.server.listen;
    for (auto& w : workers_) {
      absl::StatusOr<std::unique_ptr<Acceptor>> a = Bind(w->ioc, listen, /*reuse_port=*/true);
      if (!a.ok()) return a.status();
      w->acceptor = *std::move(a);
      listen.port = w->acceptor->local_endpoint().port();  // port 0: the others join the one chosen
    }
    port_ = listen.port;
    if (std::optional<HostPort> decision = shared_->config.server.decision.listen) {
      for (auto& w : workers_) {
        absl::StatusOr<std::unique_ptr<Acceptor>> a = Bind(w->ioc, *decision, /*reuse_port=*/true);
        if (!a.ok()) return a.status();
        w->decision_acceptor = *std::move(a);
        decision->port = w->decision_acceptor->local_endpoint().port();
      }
      decision_port_ = decision->port;
    }
    absl::StatusOr<std::unique_ptr<Acceptor>> admin =
        Bind(workers_[0]->ioc, shared_->config.server.admin, /*reuse_port=*/false);
    if (!admin.ok()) return admin.status();
    admin_acceptor_ = *std::move(admin);
    admin_port_ = admin_acceptor_->local_endpoint().port();
    if (shared_->config.grpc) {  // the Envoy rate limit service, on its own listener
      absl::StatusOr<std::unique_ptr<envoy::RlsServer>> rls = envoy::RlsServer::Start(
          shared_->config, {.local = &shared_->store, .shared = shared_->redis.get(),
                            .clock = shared_->clock, .metrics = &shared_->metrics});
      if (!rls.ok()) return rls.status();
      shared_->rls = *std::move(rls);
    }
    return absl::OkStatus();
  }

  void AddStoreMetrics() {
    Metrics& m = shared_->metrics;
    RedisStore* redis = shared_->redis.get();
    m.SetHelp("sluice_store_errors_total",
              "Decisions made by on_store_error because Redis did not answer, by policy.");
    m.AddGauge("sluice_redis_up", "1 when every Redis slot has a connected master.", "gauge",
               [redis] { return redis->Health().up ? 1 : 0; });
    m.AddGauge("sluice_redis_nodes", "Redis masters known.", "gauge",
               [redis] { return redis->Health().nodes; });
    m.AddGauge("sluice_redis_nodes_up", "Redis masters connected.", "gauge",
               [redis] { return redis->Health().nodes_up; });
    m.AddGauge("sluice_redis_calls_total", "Script calls sent to Redis.", "counter",
               [redis] { return static_cast<int64_t>(redis->Health().calls); });
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
    net::signal_set signals(workers_[0]->ioc, SIGTERM, SIGINT, SIGHUP);
    std::function<void(const boost::system::error_code&, int)> on_signal =
        [&](const boost::system::error_code& ec, int sig) {
          if (ec) return;
          if (sig == SIGHUP) {
            ReloadInBackground("SIGHUP");
            signals.async_wait(on_signal);
            return;
          }
          spdlog::info("event=signal signal={} action=drain", sig == SIGTERM ? "SIGTERM" : "SIGINT");
          Stop();
        };
    signals.async_wait(on_signal);
    net::co_spawn(workers_[0]->ioc, WatchConfig(*workers_[0]), net::detached);
    const DecisionConfig& dc = shared_->config.server.decision;
    std::string decision = "off";
    if (dc.listen) {
      decision = Cat(dc.listen->host, ":", decision_port_);
    } else if (shared_->config.routes.empty() || dc.on_gateway_listener) {
      decision = "listen";
    }
    spdlog::info("event=start listen={}:{} admin={}:{} threads={} policies={} routes={} "
                 "decision={} decision_tokens={} open_files={}",
                 shared_->config.server.listen.host, port_, shared_->config.server.admin.host,
                 admin_port_, workers_.size(), shared_->config.policies.size(),
                 shared_->config.routes.size(), decision, dc.tokens.size(), open_files_);
    LogWarnings("start", shared_->config);
    if (decision == "off") {
      spdlog::warn("event=start note=\"the decision API (/v1/check, /v1/auth) is not served: "
                   "routes are configured and server.decision.listen is not set\"");
    }
    std::vector<std::thread> threads;
    for (size_t i = 1; i < workers_.size(); ++i) {
      threads.emplace_back([w = workers_[i].get()] { w->ioc.run(); });
    }
    workers_[0]->ioc.run();
    for (std::thread& t : threads) t.join();
    reloader_.join();  // a reload under way finishes (its log line included)
    if (shared_->rls != nullptr) shared_->rls->Wait();  // its drain, begun by Stop
    // The store goes while the loops still exist: a Redis call still pending
    // (drain_timeout shorter than store.redis.timeout, a stalled Redis) is
    // answered Cancelled now, and its answer is posted to a loop that is
    // stopped but alive, which frees it with the coroutine waiting for it.
    // Destroyed after the loops, it posted into freed memory.
    shared_->redis.reset();
    spdlog::info("event=stop in_flight={}", shared_->metrics.in_flight().value());
    return absl::OkStatus();
  }

  // Stop accepting, let in-flight requests finish (within drain_timeout),
  // then stop every loop.
  void Stop() override {
    if (shared_->draining.exchange(true)) return;
    if (shared_->rls != nullptr) shared_->rls->Shutdown(shared_->config.server.drain_timeout);
    for (auto& w : workers_) {
      net::post(w->ioc, [w = w.get()] {
        boost::system::error_code ignored;
        w->acceptor->close(ignored);
        if (w->decision_acceptor != nullptr) w->decision_acceptor->close(ignored);
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
  static absl::StatusOr<std::unique_ptr<Acceptor>> Bind(net::io_context& ioc,
                                                             const HostPort& where,
                                                             bool reuse_port) {
    boost::system::error_code ec;
    tcp::resolver resolver(ioc);
    auto results = resolver.resolve(where.host, std::to_string(where.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(Cat("cannot resolve ", where.host, ": ", ec.message()));
    }
    const tcp::endpoint endpoint = results.begin()->endpoint();
    auto acceptor = std::make_unique<Acceptor>(ioc.get_executor());
    acceptor->open(endpoint.protocol(), ec);
    if (!ec) acceptor->set_option(net::socket_base::reuse_address(true), ec);
    if (!ec && reuse_port) {
      acceptor->set_option(net::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true), ec);
    }
    if (!ec) acceptor->bind(endpoint, ec);
    if (!ec) acceptor->listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          Cat("cannot listen on ", where.host, ":", where.port, ": ", ec.message()));
    }
    return acceptor;
  }

  // The config in force, for this loop. The reference stays valid until the
  // coroutine using it next suspends; code that suspends copies the pointer.
  const std::shared_ptr<const PolicySet>& Current(Worker& w) {
    const uint64_t version = shared_->policies_version.load(std::memory_order_acquire);
    if (version != w.policies_version) {
      w.policies = shared_->policies.load();
      w.policies_version = version;
    }
    return w.policies;
  }

  Counter& Connections(Listener listener) {
    Metrics& m = shared_->metrics;
    switch (listener) {
      case Listener::kGateway: return m.connections();
      case Listener::kDecision: return m.decision_connections();
      case Listener::kAdmin: break;
    }
    return m.admin_connections();
  }

  Task<void> Accept(Worker& w, Acceptor& acceptor, Listener listener) {
    Timer backoff(w.ioc.get_executor());
    for (;;) {
      boost::system::error_code ec;
      Socket socket = co_await acceptor.async_accept(net::redirect_error(kUseAwaitable, ec));
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
              std::min(Current(w)->config().server.max_connections, file_cap_)) {
        socket.close(ec);  // over the connection limit: refuse at once
        shared_->metrics.Get("sluice_connections_refused_total", {})->Add();
        continue;
      }
      net::co_spawn(acceptor.get_executor(), Session(w, std::move(socket), listener),
                    net::detached);
    }
  }

  static constexpr int64_t kAcceptBackoffMs = 100;
  static constexpr int64_t kAcceptLogIntervalMs = 10'000;

  void AcceptFailed(Listener listener, std::string_view reason,
                    const boost::system::error_code& ec) {
    shared_->AcceptErrors(listener, reason)->Add();
    const int64_t now = Worker::SteadyMs();
    int64_t last = shared_->accept_error_logged_ms.load(std::memory_order_relaxed);
    if (now - last < kAcceptLogIntervalMs ||
        !shared_->accept_error_logged_ms.compare_exchange_strong(last, now)) {
      shared_->accept_errors_unlogged.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const int64_t more = shared_->accept_errors_unlogged.exchange(0, std::memory_order_relaxed);
    spdlog::error("event=accept_error listener={} reason={} error=\"{}\" backoff_ms={} "
                  "unlogged_since_last={} note=\"logged at most once per {} s; see "
                  "sluice_accept_errors_total\"",
                  kListenerNames[static_cast<int>(listener)], reason, ec.message(),
                  kAcceptBackoffMs, more, kAcceptLogIntervalMs / 1000);
  }

  // Refusing a request whose body is still arriving: close at once and the
  // kernel answers the unread bytes with a reset that can destroy the
  // response before the client reads it. So: stop sending, read and drop
  // what still comes, within a bound of bytes and time, then close.
  static constexpr int64_t kLingerBytes = 64 * 1024 * 1024;
  static constexpr Duration kLingerTime = Duration::Seconds(5);

  Task<void> Linger(Socket& stream, Deadline& deadline) {
    boost::system::error_code ec;
    stream.shutdown(Socket::shutdown_send, ec);
    deadline.After(kLingerTime);
    std::array<char, 16 * 1024> sink;
    int64_t dropped = 0;
    while (!ec && dropped < kLingerBytes) {
      dropped += static_cast<int64_t>(co_await stream.async_read_some(
          net::buffer(sink), net::redirect_error(kUseAwaitable, ec)));
    }
  }

  // The answer to a request that could not be read, as a closing response.
  static Response Unreadable(int status, std::string_view detail) {
    Response res{static_cast<http::status>(status), 11};
    res.set(http::field::server, "sluice");
    res.set(http::field::content_type, "application/problem+json");
    res.body() = ErrorBody(status, View(http::obsolete_reason(static_cast<http::status>(status))),
                           detail);
    res.keep_alive(false);
    res.prepare_payload();
    return res;
  }

  Task<void> Session(Worker& w, Socket socket, Listener listener) {
    Metrics& metrics = shared_->metrics;
    Counter& connections = Connections(listener);
    connections.Add(1);
    boost::system::error_code ec;
    const tcp::endpoint peer = socket.remote_endpoint(ec);
    std::string peer_ip = ec ? "" : peer.address().to_string();
    if (peer.address().is_v6() && peer.address().to_v6().is_v4_mapped()) {
      peer_ip = net::ip::make_address_v4(net::ip::v4_mapped, peer.address().to_v6()).to_string();
    }
    Socket& stream = socket;
    Deadline deadline(w, stream);
    beast::flat_buffer buffer;
    bool first = true;
    for (;;) {
      // Limits and timeouts come from the config in force, so a reload
      // changes them for the next request. (Copied: the read suspends.)
      const int64_t max_header_bytes = Current(w)->config().server.max_header_bytes;
      const int64_t max_body_bytes = Current(w)->config().server.max_body_bytes;
      const Duration read_timeout = Current(w)->config().server.read_timeout;
      const Duration idle_timeout = Current(w)->config().server.idle_timeout;
      if (!first && buffer.size() == 0) {
        // Between keep-alive requests the wait for the next one is governed
        // by idle_timeout; read_timeout starts with its first byte.
        deadline.After(idle_timeout);
        co_await stream.async_wait(Socket::wait_read, net::redirect_error(kUseAwaitable, ec));
        if (ec) break;
      }
      first = false;
      http::request_parser<http::string_body> parser;
      parser.header_limit(static_cast<uint32_t>(max_header_bytes));
      parser.body_limit(static_cast<uint64_t>(max_body_bytes));
      deadline.After(read_timeout);  // a slow client gets this long for a whole request
      co_await http::async_read(stream, buffer, parser, net::redirect_error(kUseAwaitable, ec));
      if (ec) {
        int status = 0;
        std::string detail;
        if (ec == http::error::header_limit) {
          status = 431, detail = Cat("request header larger than ", max_header_bytes, " bytes");
        } else if (ec == http::error::body_limit) {
          status = 413, detail = Cat("request body larger than ", max_body_bytes, " bytes");
        } else if (ec != http::error::end_of_stream && !deadline.expired() &&
                   ec != net::error::connection_reset && ec != net::error::eof &&
                   ec.category() == http::make_error_code(http::error::bad_target).category()) {
          status = 400, detail = Cat("malformed request: ", ec.message());
        }
        if (status != 0) {
          Response res = Unreadable(status, detail);
          deadline.After(Duration::Seconds(5));
          co_await http::async_write(stream, res, net::redirect_error(kUseAwaitable, ec));
          shared_->Responses(listener, status)->Add();
          if (!ec) co_await Linger(stream, deadline);
        }
        break;
      }
      Request req = parser.release();
      if (std::optional<std::string> bad = Malformed(req)) {
        Response res = Unreadable(400, *bad);
        deadline.After(Duration::Seconds(5));
        co_await http::async_write(stream, res, net::redirect_error(kUseAwaitable, ec));
        shared_->Responses(listener, 400)->Add();
        break;
      }
      metrics.in_flight().Add(1);
      deadline.Never();
      // (No co_await inside ?: : g++ 12 miscompiles it.)
      Response res;
      if (listener == Listener::kAdmin) {
        res = co_await HandleAdmin(w, req);
      } else {
        res = co_await Handle(w, req, peer_ip, listener);
      }
      if (shared_->draining.load()) res.keep_alive(false);
      if (req.method() == http::verb::head && !res.body().empty()) {
        // A response to HEAD has the GET's header fields and no body
        // (RFC 9110 section 9.3.2): a body here would be read by the client
        // as the start of the next response.
        const size_t length = res.body().size();
        res.body().clear();
        res.content_length(length);
      }
      shared_->Responses(listener, res.result_int())->Add();
      const ServerConfig& sc = Current(w)->config().server;
      if (sc.access_log) {
        spdlog::info("event=access listener={} peer={} method={} target=\"{}\" status={}",
                     kListenerNames[static_cast<int>(listener)], peer_ip,
                     View(req.method_string()), View(req.target()), res.result_int());
      }
      deadline.After(sc.read_timeout);
      co_await http::async_write(stream, res, net::redirect_error(kUseAwaitable, ec));
      metrics.in_flight().Add(-1);
      if (ec || !res.keep_alive()) break;
    }
    stream.shutdown(Socket::shutdown_send, ec);
    connections.Add(-1);
  }



  HeaderList AnswerHeaders(const std::vector<policy::Applied>& applied,
                           const policy::Verdict& verdict, Worker& w) {
    HeaderList headers;
    verdict.AppendHeaders(applied, Current(w)->config().server.legacy_headers, w.rng, headers);
    return headers;
  }

  // Whether `listener` serves the decision API under `config` (see
  // DecisionConfig): routes can come and go with a reload.
  static bool ServesDecisions(Listener listener, const Config& config) {
    if (listener == Listener::kDecision) return true;
    const DecisionConfig& dc = config.server.decision;
    return listener == Listener::kGateway && !dc.listen &&
           (config.routes.empty() || dc.on_gateway_listener);
  }

  Task<Response> Handle(Worker& w, Request& req, const std::string& peer_ip, Listener listener) {
    const Config& config = Current(w)->config();
    const std::string_view path = TargetPath(View(req.target()));
    const bool decision_path =
        path == "/v1/check" || path == "/v1/auth" || path.substr(0, 9) == "/v1/auth/";
    if (decision_path && ServesDecisions(listener, config)) {
      if (!config.server.decision.tokens.empty() &&
          !BearerTokenIn(config.server.decision.tokens, View(req[http::field::authorization]))) {
        Response res = Problem(401, req, "unauthorized",
                               "the decision API needs \"Authorization: Bearer <token>\" with a "
                               "token from server.decision");
        res.set(http::field::www_authenticate, "Bearer realm=\"sluice\"");
        co_return res;
      }
      if (path == "/v1/check") co_return co_await Check(w, req);
      co_return co_await Auth(w, req, peer_ip, path);
    }
    if (listener == Listener::kDecision) {
      co_return Problem(404, req, "not found",
                        "the decision listener serves POST /v1/check and /v1/auth/{policy}");
    }
    co_return co_await Gateway(w, req, peer_ip);
  }

  // ---- the decision API ----

  // A check's error as the JSON object a batch answers in its place; sets
  // `status` to `code`.
  static std::string CheckError(int code, std::string_view title, const std::string& detail,
                                int& status) {
    status = code;
    std::string out = "{\"error\":";
    AppendJsonString(out, title);
    out += ",\"detail\":";
    AppendJsonString(out, detail);
    out += Cat(",\"status\":", code, "}");
    return out;
  }

  // One check of the decision API. Returns its JSON object and sets
  // `status` (200, 429, or the 4xx of a bad item, whose JSON then has
  // "error" and "detail").
  Task<std::string> DecideOne(Worker& w, const nlohmann::json& item, const PolicySet& set,
                              int& status, HeaderList* headers) {
    auto fail = [&](int code, std::string_view title, const std::string& detail) {
      return CheckError(code, title, detail, status);
    };
    if (!item.is_object()) co_return fail(400, "bad request", "each check must be a JSON object");
    for (const auto& [k, v] : item.items()) {
      if (k != "policy" && k != "key" && k != "cost") {
        co_return fail(400, "bad request", Cat("unknown field \"", k, "\" (expected policy, key, cost)"));
      }
    }
    const auto policy_it = item.find("policy");
    if (policy_it == item.end() || !policy_it->is_string()) {
      co_return fail(400, "bad request", "\"policy\" (a string) is required");
    }
    const auto key_it = item.find("key");
    if (key_it == item.end() || !key_it->is_string()) {
      co_return fail(400, "bad request", "\"key\" (a string) is required");
    }
    int64_t cost = 1;
    if (const auto c = item.find("cost"); c != item.end()) {
      if (!c->is_number_integer()) {
        co_return fail(400, "bad request", "\"cost\" must be a whole number");
      }
      if (c->is_number_unsigned() ? c->get<uint64_t>() > static_cast<uint64_t>(kMaxLimit)
                                  : c->get<int64_t>() > kMaxLimit) {
        co_return fail(400, "bad request", Cat("\"cost\" must be at most ", kMaxLimit));
      }
      cost = c->get<int64_t>();
      if (cost < 0) co_return fail(400, "bad request", "\"cost\" must not be negative");
    }
    co_return co_await DecideChecked(w, set, policy_it->get_ref<const std::string&>(),
                                     key_it->get_ref<const std::string&>(), cost, status, headers);
  }

  // The rest of a check, once its fields have the right types.
  Task<std::string> DecideChecked(Worker& w, const PolicySet& set, std::string_view name,
                                  std::string_view key, int64_t cost, int& status,
                                  HeaderList* headers) {
    auto fail = [&](int code, std::string_view title, const std::string& detail) {
      return CheckError(code, title, detail, status);
    };
    const Policy* policy = set.Find(name);
    if (policy == nullptr) co_return fail(404, "unknown policy", Cat("no policy named \"", name, "\""));
    if (key.empty()) co_return fail(400, "bad request", "\"key\" must not be empty");
    // A key over 1024 bytes is the policy's long_keys to decide (hashed, or
    // refused: an InvalidArgument answered 400 below).
    // The decision API names the key itself; the policy's key parts are for
    // the gateway and auth_request.
    const auto start = std::chrono::steady_clock::now();
    const std::vector<policy::Applied> applied = {
        {.policy = policy, .key = std::string(key), .cost = cost}};
    const policy::Verdict verdict = co_await EvaluateOn(w.ioc, applied, shared_->clock->Now());
    shared_->metrics.decision_latency().Observe(std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - start).count());
    if (!verdict.error.ok()) co_return fail(400, "bad request", std::string(verdict.error.message()));
    const PolicyDecision& d = verdict.answers[0].decision;
    std::string out = Cat("{\"allowed\":", verdict.allowed ? "true" : "false", ",\"policy\":");
    AppendJsonString(out, name);
    out += Cat(",\"limit\":", d.limit, ",\"remaining\":", std::max<int64_t>(0, d.remaining),
               ",\"reset_after_ms\":", d.reset_after.CeilMillis(), ",\"retry_after_ms\":");
    out += d.can_never_pass() ? std::string("null") : Cat(d.retry_after.CeilMillis());
    out += Cat(",\"delay_ms\":", d.delay.CeilMillis());
    if (!verdict.shadow_denied.empty()) out += ",\"shadow_denied\":true";
    if (d.can_never_pass()) out += ",\"never\":true";
    out.push_back('}');
    status = verdict.allowed ? 200 : 429;
    if (headers != nullptr) *headers = AnswerHeaders(applied, verdict, w);
    co_return out;
  }

  Task<Response> Check(Worker& w, const Request& req) {
    if (req.method() != http::verb::post) {
      Response res = Problem(405, req, "method not allowed", "use POST /v1/check");
      res.set(http::field::allow, "POST");
      co_return res;
    }
    // A copy: a decision in Redis suspends, and a reload meanwhile must not
    // free the policies it uses.
    const std::shared_ptr<const PolicySet> set = Current(w);
    if (std::optional<FlatCheck> flat = ParseFlatCheck(req.body())) {
      int status = 200;
      HeaderList headers;
      std::string result = co_await DecideChecked(w, *set, flat->policy, flat->key, flat->cost,
                                                   status, &headers);
      if (status == 200 || status == 429) {
        co_return MakeResponse(status, req.version(), req.keep_alive(), std::move(result),
                            "application/json", headers);
      }
      nlohmann::json error = nlohmann::json::parse(result);
      co_return Problem(status, req, error["error"].get<std::string>(), error["detail"].get<std::string>());
    }
    if (!JsonDepthWithin(req.body(), kMaxJsonDepth)) {
      co_return Problem(400, req, "bad request",
                        Cat("the body nests arrays and objects deeper than ", kMaxJsonDepth,
                            " levels; a check is an object, a batch an array of them"));
    }
    nlohmann::json body = nlohmann::json::parse(req.body(), nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) co_return Problem(400, req, "bad request", "the body is not valid JSON");
    if (body.is_array()) {
      if (body.size() > 1000) {
        co_return Problem(400, req, "bad request", "a batch holds at most 1000 checks");
      }
      std::string results = "[";
      for (const nlohmann::json& item : body) {
        if (results.size() > 1) results.push_back(',');
        int status = 200;
        results += co_await DecideOne(w, item, *set, status, nullptr);
      }
      results.push_back(']');
      co_return MakeResponse(200, req.version(), req.keep_alive(), std::move(results), "application/json");
    }
    int status = 200;
    HeaderList headers;
    std::string result = co_await DecideOne(w, body, *set, status, &headers);
    if (status == 200 || status == 429) {
      co_return MakeResponse(status, req.version(), req.keep_alive(), std::move(result),
                          "application/json", headers);
    }
    // A bad single check: the same error as a problem document.
    nlohmann::json error = nlohmann::json::parse(result);
    co_return Problem(status, req, error["error"].get<std::string>(), error["detail"].get<std::string>());
  }

  // ---- NGINX auth_request ----

  Task<Response> Auth(Worker& w, const Request& req, const std::string& peer_ip,
                      std::string_view path) {
    const std::shared_ptr<const PolicySet> set = Current(w);  // a copy: a decision may suspend
    std::string path_storage, host;
    const RequestFacts facts = AuthFactsOf(req, peer_ip, path_storage, host);
    std::vector<const Policy*> applying;
    if (path.size() > 9) {
      const Policy* p = set->Find(path.substr(9));
      if (p == nullptr) {
        co_return Problem(404, req, "unknown policy", Cat("no policy named \"", path.substr(9), "\""));
      }
      applying.push_back(p);
    } else {
      applying = set->Matching(facts);
    }
    std::vector<policy::Applied> applied;
    const policy::Verdict ev = co_await shared_->Evaluate(w.ioc, *set, applying, facts, "", applied);
    if (!ev.error.ok()) co_return Problem(400, req, "bad request", std::string(ev.error.message()));
    HeaderList headers = AnswerHeaders(applied, ev, w);
    // 2xx lets NGINX forward the request; 403 (mapped to 429 by
    // `error_page 403 =429`) carries Retry-After and the RateLimit fields.
    if (ev.allowed) co_return MakeResponse(204, req.version(), req.keep_alive(), "", "", headers);
    co_return MakeResponse(403, req.version(), req.keep_alive(), ProblemBody(429, ev.violated, ev.detail),
                        "application/problem+json", headers);
  }

  // ---- the gateway ----

  Task<Response> Gateway(Worker& w, Request& req, const std::string& peer_ip) {
    // A copy: the request is held across the shaping delay and the upstream
    // exchange, and a reload meanwhile must not free the policies it uses.
    const std::shared_ptr<const PolicySet> set = Current(w);
    const ServerConfig& sc = set->config().server;
    std::string path_storage, host;
    const std::string method(View(req.method_string()));
    RequestFacts facts = FactsOf(req, peer_ip, method, View(req.target()), path_storage, host);
    const RouteConfig* route = set->RouteFor(facts);
    if (route == nullptr) {
      co_return Problem(404, req, "not found",
                        Cat("no route matches ", method, " ", facts.path));
    }
    std::vector<policy::Applied> applied;
    const policy::Verdict ev =
        co_await shared_->Evaluate(w.ioc, *set, set->Matching(facts), facts, route->name, applied);
    if (!ev.error.ok()) co_return Problem(400, req, "bad request", std::string(ev.error.message()));
    HeaderList headers = AnswerHeaders(applied, ev, w);
    if (!ev.allowed) {
      co_return MakeResponse(ev.status, req.version(), req.keep_alive(),
                             ProblemBody(ev.status, ev.violated, ev.detail),
                             "application/problem+json", headers);
    }
    if (ev.delay > Duration::Zero()) {  // leaky_bucket shape: hold, then forward
      Timer timer(w.ioc.get_executor(), std::chrono::microseconds(ev.delay.micros()));
      boost::system::error_code ec;
      co_await timer.async_wait(net::redirect_error(kUseAwaitable, ec));
    }
    std::string marker;  // Sluice-Shadow-Denied: the shadow policies that would have denied
    for (const std::string& name : ev.shadow_denied) {
      if (!marker.empty()) marker += ", ";
      marker += Cat("\"", name, "\"");
    }
    if (const std::optional<std::string_view> authority = TargetAuthority(View(req.target()))) {
      // Absolute form: the upstream gets the origin form and the target's
      // host as Host, so that it serves what the policies were decided on.
      const std::string_view target = View(req.target());
      const std::string host(*authority);
      const std::string origin(target.substr(authority->data() + authority->size() - target.data()));
      req.target(origin.empty() || origin.front() != '/' ? Cat("/", origin) : origin);
      req.set(http::field::host, host);
    }
    Response res = co_await Forward(w, req, *route, peer_ip, sc, marker);
    for (const auto& [name, value] : headers) res.set(name, value);
    co_return res;
  }

  // Drops the hop-by-hop fields of `message`: the fixed list and every
  // field the Connection header names (RFC 9110 section 7.6.1).
  template <typename Message>
  static void DropHopByHop(Message& message) {
    std::vector<std::string> named;
    for (auto it = message.find(http::field::connection); it != message.end() &&
                                                          it->name() == http::field::connection;
         ++it) {
      std::string_view value = View(it->value());
      while (!value.empty()) {
        const size_t comma = value.find(',');
        std::string_view token = value.substr(0, comma);
        while (!token.empty() && (token.front() == ' ' || token.front() == '\t')) token.remove_prefix(1);
        while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
        if (!token.empty()) named.emplace_back(token);
        value = comma == std::string_view::npos ? std::string_view() : value.substr(comma + 1);
      }
    }
    for (const std::string& name : named) message.erase(beast::string_view(name.data(), name.size()));
    for (http::field f : {http::field::connection, http::field::keep_alive,
                          http::field::proxy_authenticate, http::field::proxy_authorization,
                          http::field::te, http::field::trailer, http::field::transfer_encoding,
                          http::field::upgrade}) {
      message.erase(f);
    }
  }

  // `shadow_marker`: the value of Sluice-Shadow-Denied, empty for none.
  Task<Response> Forward(Worker& w, Request& req, const RouteConfig& route,
                         const std::string& peer_ip, const ServerConfig& sc,
                         std::string_view shadow_marker) {
    const bool client_keep_alive = req.keep_alive();
    const unsigned client_version = req.version();
    const bool head = req.method() == http::verb::head;
    DropHopByHop(req);
    // Only sluice sets the marker: a client's copy is dropped, and it is set
    // after the hop-by-hop fields are gone, so a client naming it in
    // Connection cannot strip it.
    req.erase("Sluice-Shadow-Denied");
    if (!shadow_marker.empty()) {
      req.set("Sluice-Shadow-Denied",
              beast::string_view(shadow_marker.data(), shadow_marker.size()));
    }
    // sluice holds the whole body already: the upstream has nothing to wait
    // for, and an interim 100 Continue must not reach the client.
    req.erase(http::field::expect);
    std::string xff(View(req["X-Forwarded-For"]));
    req.set("X-Forwarded-For", xff.empty() ? peer_ip : Cat(xff, ", ", peer_ip));
    req.version(11);
    req.keep_alive(true);
    req.prepare_payload();
    boost::system::error_code ec;
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::optional<Socket> pooled = attempt == 0 ? w.pool.Take(route.upstream) : std::nullopt;
      const bool reused = pooled.has_value();
      Socket stream = reused ? std::move(*pooled) : Socket(w.ioc.get_executor());
      Deadline deadline(w, stream);
      deadline.After(sc.upstream_timeout);
      if (!reused) {
        Resolver resolver(w.ioc.get_executor());
        auto endpoints = co_await resolver.async_resolve(
            route.upstream.host, std::to_string(route.upstream.port),
            net::redirect_error(kUseAwaitable, ec));
        if (!ec) co_await net::async_connect(stream, endpoints, net::redirect_error(kUseAwaitable, ec));
        if (ec) {
          co_return UpstreamError(route, client_version, client_keep_alive, ec,
                                  deadline.expired() ? "timeout" : "connect");
        }
      }
      co_await http::async_write(stream, req, net::redirect_error(kUseAwaitable, ec));
      beast::flat_buffer buffer;
      std::optional<http::response_parser<http::string_body>> parser;
      // Interim (1xx) answers are read and dropped; the final one is relayed.
      do {
        parser.emplace();
        parser->body_limit(64 * 1024 * 1024);
        parser->skip(head);  // a response to HEAD has no body, whatever it says
        if (!ec) co_await http::async_read(stream, buffer, *parser, net::redirect_error(kUseAwaitable, ec));
      } while (!ec && parser->get().result_int() >= 100 && parser->get().result_int() < 200 &&
               parser->get().result() != http::status::switching_protocols);
      if (ec) {
        // A pooled connection the upstream closed meanwhile: retry once on a new one.
        if (reused && !deadline.expired()) continue;
        co_return UpstreamError(route, client_version, client_keep_alive, ec,
                                deadline.expired() ? "timeout" : "exchange");
      }
      Response res = parser->release();
      if (res.keep_alive() && buffer.size() == 0) {
        deadline.Never();
        w.pool.Give(route.upstream, std::move(stream));
      }
      DropHopByHop(res);
      res.version(client_version);
      res.keep_alive(client_keep_alive);
      if (head) {
        // Keep the upstream's Content-Length: it describes the GET body.
        res.keep_alive(client_keep_alive);
      } else {
        res.prepare_payload();
      }
      co_return res;
    }
    co_return UpstreamError(route, client_version, client_keep_alive, ec, "exchange");
  }

  Response UpstreamError(const RouteConfig& route, unsigned version, bool keep_alive,
                         const boost::system::error_code& ec, std::string_view kind) {
    const bool timeout = kind == "timeout";
    shared_->metrics.Get("sluice_upstream_errors_total",
                         {{"route", route.name}, {"kind", timeout ? "timeout" : std::string(kind)}})
        ->Add();
    spdlog::warn("event=upstream_error route={} upstream={}:{} kind={} error=\"{}\"", route.name,
                 route.upstream.host, route.upstream.port, timeout ? "timeout" : kind, ec.message());
    const int status = timeout ? 504 : 502;
    return MakeResponse(status, version, keep_alive,
                        ErrorBody(status, timeout ? "upstream timeout" : "bad gateway",
                                  Cat("route \"", route.name, "\": upstream ", route.upstream.host,
                                      ":", route.upstream.port, " ",
                                      timeout ? "did not answer in time" : Cat("failed: ", ec.message()))),
                        "application/problem+json");
  }

  // ---- admin ----

  Task<Response> HandleAdmin(Worker& w, const Request& req) {
    const std::string_view target = View(req.target());
    const std::string_view path = target.substr(0, target.find('?'));
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      co_return Problem(405, req, "method not allowed", "the admin listener answers GET");
    }
    if (path == "/metrics") {
      co_return MakeResponse(200, req.version(), req.keep_alive(), shared_->metrics.Render(),
                          "text/plain; version=0.0.4; charset=utf-8");
    }
    if (path == "/healthz") co_return MakeResponse(200, req.version(), req.keep_alive(), "ok\n", "text/plain");
    if (path == "/readyz") {
      if (shared_->draining.load()) {
        co_return MakeResponse(503, req.version(), req.keep_alive(), "draining\n", "text/plain");
      }
      // Ready means the store is reachable: with Redis down, decisions
      // follow on_store_error, and a balancer should prefer other instances.
      if (shared_->redis != nullptr) {
        const RedisStoreHealth h = shared_->redis->Health();
        if (!h.up) {
          co_return MakeResponse(503, req.version(), req.keep_alive(),
                                 Cat("store unavailable: redis, ", h.nodes_up, " of ", h.nodes,
                                     " masters connected\n"),
                                 "text/plain");
        }
      }
      co_return MakeResponse(200, req.version(), req.keep_alive(), "ready\n", "text/plain");
    }
    if (path == "/v1/config") {
      co_return MakeResponse(200, req.version(), req.keep_alive(), ConfigJson().dump(2), "application/json");
    }
    if (path.substr(0, 9) == "/v1/keys/") {
      const std::string_view rest = path.substr(9);
      const size_t slash = rest.find('/');
      if (slash == std::string_view::npos) {
        co_return Problem(400, req, "bad request", "use /v1/keys/{policy}/{key}");
      }
      std::optional<std::string> name = PercentDecode(rest.substr(0, slash));
      std::optional<std::string> key = PercentDecode(rest.substr(slash + 1));
      if (!name || !key) co_return Problem(400, req, "bad request", "bad percent-encoding");
      std::shared_ptr<const PolicySet> set = shared_->policies.load();
      const Policy* policy = set->Find(*name);
      if (policy == nullptr) co_return Problem(404, req, "unknown policy", Cat("no policy named \"", *name, "\""));
      const Time now = shared_->clock->Now();
      using Decisions = absl::StatusOr<std::vector<Decision>>;
      Limiter& limiter = policy->limiter();
      const Decisions state = co_await Await<Decisions>(w.ioc, [&](InspectCallback done) {
        limiter.InspectAsync(*key, now, 0, std::move(done));
      });
      const Decisions next = co_await Await<Decisions>(w.ioc, [&](InspectCallback done) {
        limiter.InspectAsync(*key, now, 1, std::move(done));
      });
      if (!state.ok() || !next.ok()) {
        const absl::Status& error = state.ok() ? next.status() : state.status();
        const bool bad = absl::IsInvalidArgument(error);
        co_return Problem(bad ? 400 : 503, req, bad ? "bad request" : "store unavailable",
                          std::string(error.message()));
      }
      nlohmann::json limits = nlohmann::json::array();
      for (size_t i = 0; i < state->size(); ++i) {
        const LimitConfig& c = policy->limiter().limits()[i];
        limits.push_back({{"algorithm", std::string(AlgorithmName(AlgorithmOf(c)))},
                          {"rate", FormatRate(RateOf(c))},
                          {"limit", (*state)[i].limit},
                          {"remaining", std::max<int64_t>(0, (*state)[i].remaining)},
                          {"reset_after_ms", (*state)[i].reset_after.CeilMillis()},
                          {"next_request_allowed", (*next)[i].allowed},
                          {"next_request_retry_after_ms", (*next)[i].retry_after.CeilMillis()},
                          {"next_request_delay_ms", (*next)[i].delay.CeilMillis()}});
      }
      nlohmann::json body = {{"policy", *name}, {"key", *key}, {"limits", limits}};
      co_return MakeResponse(200, req.version(), req.keep_alive(), body.dump(2), "application/json");
    }
    co_return Problem(404, req, "not found",
                   "admin endpoints: /metrics /healthz /readyz /v1/config /v1/keys/{policy}/{key}");
  }

  nlohmann::json ConfigJson() const {
    std::shared_ptr<const PolicySet> set = shared_->policies.load();
    nlohmann::json policies = nlohmann::json::array();
    for (const Policy& p : set->policies()) {
      nlohmann::json limits = nlohmann::json::array();
      for (const LimitSpec& spec : p.config().limits) {
        nlohmann::json l = {{"algorithm", std::string(AlgorithmName(spec.options.algorithm))},
                            {"rate", FormatRate(spec.options.rate)},
                            {"scope", spec.scope == Scope::kLocal ? "local" : "global"}};
        if (spec.options.burst != 0) l["burst"] = spec.options.burst;
        if (spec.options.algorithm == Algorithm::kLeakyBucket) {
          l["mode"] = spec.options.mode == LeakyMode::kShape ? "shape" : "police";
          if (spec.options.max_delay > Duration::Zero()) l["max_delay"] = FormatDuration(spec.options.max_delay);
          if (spec.options.queue > 0) l["queue"] = spec.options.queue;
        }
        limits.push_back(l);
      }
      nlohmann::json key = nlohmann::json::array();
      for (const KeyPart& part : p.config().key) {
        switch (part.kind) {
          case KeyPart::Kind::kClientIp: key.push_back("client_ip"); break;
          case KeyPart::Kind::kHeader: key.push_back("header:" + part.header); break;
          case KeyPart::Kind::kPath: key.push_back("path"); break;
          case KeyPart::Kind::kRoute: key.push_back("route"); break;
          case KeyPart::Kind::kGlobal: key.push_back("global"); break;
        }
      }
      nlohmann::json entry = {{"name", p.name()}, {"key", key}, {"limits", limits},
                              {"shadow", p.config().shadow},
                              {"on_missing_key", p.config().on_missing_key == MissingKey::kDeny ? "deny" : "client_ip"},
                              {"long_keys", p.config().long_keys == LongKeys::kHash ? "hash" : "refuse"},
                              {"on_deny", {{"status", p.config().on_deny.status}}}};
      if (p.config().on_deny.retry_after_jitter) {
        entry["on_deny"]["retry_after_jitter"] = FormatDuration(*p.config().on_deny.retry_after_jitter);
      }
      if (p.config().match) {
        const MatchConfig& m = *p.config().match;
        nlohmann::json match = nlohmann::json::object();
        if (m.path_prefix) match["path_prefix"] = *m.path_prefix;
        if (m.path) match["path"] = *m.path;
        if (m.method) match["method"] = *m.method;
        if (m.host) match["host"] = *m.host;
        if (!m.headers.empty()) match["headers"] = m.headers;
        entry["match"] = match;
      }
      policies.push_back(entry);
    }
    nlohmann::json routes = nlohmann::json::array();
    for (const RouteConfig& r : set->config().routes) {
      routes.push_back({{"name", r.name}, {"upstream", Cat("http://", r.upstream.host, ":", r.upstream.port)}});
    }
    return {{"source", set->config().source}, {"policies", policies}, {"routes", routes}};
  }

  // ---- operations ----

  void ReloadInBackground(std::string_view why) {
    net::post(reloader_, [shared = shared_, why = std::string(why)] { (void)shared->Reload(why); });
  }

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
    }
  }

  std::pair<int64_t, int64_t> ConfigStamp() const {
    struct stat st {};
    if (stat(shared_->config_path.c_str(), &st) != 0) return {0, 0};
    return {static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
            static_cast<int64_t>(st.st_size)};
  }

  // Polls the file's stamp (mtime, size). A change is loaded once the stamp
  // has held still for one poll, so a file caught halfway through an
  // editor's rewrite is not read; an empty file is refused by the reload.
  Task<void> WatchConfig(Worker& w) {
    std::pair<int64_t, int64_t> last = initial_stamp_;
    std::optional<std::pair<int64_t, int64_t>> changed;  // seen at the previous poll
    Timer timer(w.ioc.get_executor());
    while (!shared_->draining.load()) {
      timer.expires_after(std::chrono::milliseconds(250));
      boost::system::error_code ec;
      co_await timer.async_wait(net::redirect_error(kUseAwaitable, ec));
      if (shared_->config_path.empty()) continue;
      const std::pair<int64_t, int64_t> now = ConfigStamp();
      if (now == last || now.first == 0) {
        changed.reset();
      } else if (changed == now) {
        last = now;
        changed.reset();
        ReloadInBackground("file-change");
      } else {
        changed = now;
      }
    }
  }

  Task<void> Drain() {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::microseconds(shared_->config.server.drain_timeout.micros());
    Timer timer(workers_[0]->ioc.get_executor());
    while (shared_->metrics.in_flight().value() > 0 && std::chrono::steady_clock::now() < deadline) {
      timer.expires_after(std::chrono::milliseconds(20));
      boost::system::error_code ec;
      co_await timer.async_wait(net::redirect_error(kUseAwaitable, ec));
    }
    if (shared_->metrics.in_flight().value() > 0) {
      spdlog::warn("event=drain result=deadline in_flight={}", shared_->metrics.in_flight().value());
    }
    for (auto& w : workers_) w->ioc.stop();
  }

  std::shared_ptr<Shared> shared_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<Acceptor> admin_acceptor_;
  uint16_t port_ = 0;
  uint16_t admin_port_ = 0;
  uint16_t decision_port_ = 0;
  int64_t open_files_ = 0;  // RLIMIT_NOFILE, once raised
  int64_t file_cap_ = INT64_MAX;  // connections per listener the file limit leaves room for
  std::pair<int64_t, int64_t> initial_stamp_{0, 0};
  // Reloads read and validate the file off the event loops, one at a time.
  net::thread_pool reloader_{1};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Create(Config config, std::string config_path,
                                                       const Clock* clock) {
  auto server = std::make_unique<ServerImpl>(std::move(config), std::move(config_path),
                                             clock != nullptr ? clock : &SystemClock::Default());
  if (absl::Status s = server->Init(); !s.ok()) return s;
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace sluice::server
