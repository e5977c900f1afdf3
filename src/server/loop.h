// The event loops of `sluice serve`: one io_context per thread (a Worker),
// coroutine tasks bound to it, connection deadlines swept by the loop, and
// the bridge from an answer that arrives by callback on another thread (a
// Redis decision) back to the loop. Asio only; no Beast.
//
// Thread-safety: a Worker and everything in it belong to its loop's thread.
#ifndef SLUICE_SERVER_LOOP_H_
#define SLUICE_SERVER_LOOP_H_

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/basic_socket_acceptor.hpp>
#include <boost/asio/basic_stream_socket.hpp>
#include <boost/asio/basic_waitable_timer.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "base/cat.h"
#include "policy/evaluation.h"
#include "server/socket.h"
#include "server/state.h"
#include "server/tls_socket.h"
#include "server/upstream_answer.h"
#include "sluice/store/store.h"

namespace sluice::server {

// Bound to the thread's io_context by the concrete executor type, as Task
// (server/socket.h).
using Acceptor = net::basic_socket_acceptor<tcp, Executor>;
using Timer = net::basic_waitable_timer<std::chrono::steady_clock,
                                        net::wait_traits<std::chrono::steady_clock>, Executor>;
using Resolver = net::ip::basic_resolver<tcp, Executor>;

// A message's head and body, written together (one gathered system call).
inline std::array<net::const_buffer, 2> Gathered(const std::string& head, std::string_view body) {
  return {net::const_buffer(head.data(), head.size()), net::const_buffer(body.data(), body.size())};
}

// Writes what the socket takes of `buffers` at once, without waiting, and
// advances them past it; true when nothing is left. An answer (a few hundred
// bytes) nearly always goes whole, and then the caller has no completion to
// wait for (async_write posts its completion even when it wrote at once).
// What is left goes through async_write.
inline bool WriteNow(Socket& socket, std::array<net::const_buffer, 2>& buffers,
                     boost::system::error_code& ec) {
  if (!socket.non_blocking()) socket.non_blocking(true, ec);
  size_t written = ec ? 0 : socket.write_some(buffers, ec);
  if (ec == net::error::would_block || ec == net::error::try_again) ec = {};
  for (net::const_buffer& b : buffers) {
    const size_t n = std::min(written, b.size());
    b += n;
    written -= n;
  }
  return !ec && buffers[0].size() + buffers[1].size() == 0;
}

// Feeds `parser` what `buffer` holds, as Beast's read does, and drops
// what it used. True when the message is whole or `ec` says what is wrong
// with it; false when the parser wants more bytes. Reading this way instead
// of with http::async_read saves its composed operation, which costs a trip
// through the loop's queue even when the message is already in the buffer.
template <typename Parser>
bool FeedParser(Parser& parser, boost::beast::flat_buffer& buffer, boost::system::error_code& ec) {
  while (buffer.size() > 0) {
    const size_t used = parser.put(buffer.data(), ec);
    buffer.consume(used);
    if (ec == boost::beast::http::error::need_more) {
      ec = {};
      return false;
    }
    if (ec || parser.is_done()) return true;
    if (used == 0) return false;
  }
  return false;
}

// The connection ended (a read said eof) while `parser` wanted more, as
// Beast's read says it: a message cut short (partial_message), or none at
// all (end_of_stream), in `ec`.
template <typename Parser>
void EndOfInput(Parser& parser, boost::system::error_code& ec) {
  ec = {};
  if (parser.got_some()) {
    parser.put_eof(ec);
  } else {
    ec = boost::beast::http::error::end_of_stream;
  }
}

struct Worker;

// A connection to an upstream, with what it keeps from one exchange to the
// next: the buffer its answers are read into (empty between exchanges) and
// the one its requests' heads are written into.
struct UpstreamConnection {
  explicit UpstreamConnection(Socket s) : socket(std::move(s)) {}

  Socket socket;
  std::unique_ptr<TlsSocket> tls;  // an https:// upstream's (after `socket`: goes first)
  boost::beast::flat_buffer buffer;
  std::string head;
};

// What goes on after an upstream's head is written (wire.h, Relayed::after;
// gateway.cc makes it, the connection's coroutine carries it on): the
// upstream's connection, now a WebSocket tunnel's other end or the source
// of a body still coming, with the parser reading the rest of that body
// and the pool the connection goes back to when it ends whole; and what
// the request holds meanwhile (its concurrency slots), given back when
// this goes.
struct AfterHead {
  // The concurrency slots a request holds while what follows its head
  // goes on: renewed as it goes, given back when this goes.
  class Slots {
   public:
    virtual ~Slots() = default;
    // Renews their leases at `now` once a third of the shortest has
    // passed since they were last taken or renewed.
    virtual void Renew(Time now) = 0;
  };

  std::unique_ptr<UpstreamConnection> upstream;
  std::optional<AnswerParser> parser;  // a body still coming
  HostPort pool;                       // an http:// upstream's pool key
  std::string tls_pool;                // an https:// upstream's (TlsPoolKey); empty: http://
  Duration timeout;                    // the route's upstream_timeout (zero: the server's)
  Duration idle;                       // a tunnel's: the route's idle_timeout (zero: the server's)
  std::shared_ptr<Slots> hold;
};

// Idle keep-alive connections to upstreams, per loop (no locking), found
// by the route's HostPort itself and held by pointer: a key made per
// request ("host:port", an allocation), a tree of strings and a
// connection moved four times (its socket, buffer and head) cost about 900
// instructions a gatewayed request, take and give.
// Connections to https:// upstreams are found by the upstream, what their
// certificate was verified against and the certificate sluice presented
// (TlsPoolKey): a route that trusts other authorities never takes a
// connection another route's verified, nor one made as another client.
template <typename Key, typename Hash>
class UpstreamPoolOf {
 public:
  std::unique_ptr<UpstreamConnection> Take(const Key& upstream) {
    auto it = idle_.find(upstream);
    if (it == idle_.end() || it->second.empty()) return nullptr;
    std::unique_ptr<UpstreamConnection> c = std::move(it->second.back());
    it->second.pop_back();
    return c;
  }
  void Give(const Key& upstream, std::unique_ptr<UpstreamConnection> c) {
    auto& list = idle_[upstream];
    if (list.size() < 64) list.push_back(std::move(c));
  }

 private:
  absl::flat_hash_map<Key, std::vector<std::unique_ptr<UpstreamConnection>>, Hash> idle_;
};
struct HostPortHash {
  size_t operator()(const HostPort& hp) const { return absl::HashOf(hp.host, hp.port); }
};
using UpstreamPool = UpstreamPoolOf<HostPort, HostPortHash>;
using TlsUpstreamPool = UpstreamPoolOf<std::string, absl::Hash<std::string>>;

// A route's key in the TlsUpstreamPool: its upstream, the authorities and
// name its certificate is verified by, and the certificate sluice
// presented (a connection made as one client is never another route's).
inline std::string TlsPoolKey(const RouteConfig& route) {
  return internal::Cat(route.upstream.host, "\n", route.upstream.port, "\n", route.upstream_ca_file,
                       "\n", route.upstream_server_name, "\n", route.upstream_cert_file);
}

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
  // No later than `at_ms` (the loop's milliseconds, as now_ms()).
  void NoLaterThan(int64_t at_ms) { at_ms_ = std::min(at_ms_, at_ms + kSweepMs); }
  void Never() { at_ms_ = INT64_MAX; }
  // The loop's milliseconds (Worker::now_ms, refreshed by the sweep).
  int64_t now_ms() const;
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

// A loop's turn (sluice/store/store.h): what the loop posts now runs after
// the work it already had ready.
class Turn final : public LoopTurn {
 public:
  explicit Turn(net::io_context& ioc) : ioc_(ioc) {}
  void AtTurnEnd(std::function<void()> fn) override { net::post(ioc_, std::move(fn)); }

 private:
  net::io_context& ioc_;
};

struct Worker {
  // The policies in force, for this loop. The reference stays valid until
  // the coroutine using it next suspends; code that suspends copies the
  // pointer.
  const std::shared_ptr<const policy::PolicySet>& Current(ServerState& state) {
    const uint64_t version = state.policies_version.load(std::memory_order_acquire);
    if (version != policies_version) {
      policies = state.policies.load();
      policies_version = version;
    }
    return policies;
  }

  static int64_t SteadyMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // The policies in force as this loop last saw them (see ServerState).
  std::shared_ptr<const policy::PolicySet> policies;
  uint64_t policies_version = UINT64_MAX;
  // Declared before `ioc`, so destroyed after it: coroutines still parked in
  // the loop at shutdown unregister their deadlines as `ioc` destroys them.
  std::list<Deadline*> deadlines;
  // One thread runs the loop, and only it works on the loop's sockets,
  // acceptors and timers (other threads post to it; a connection moved to
  // another loop goes as its descriptor). So the reactor takes no lock per
  // read or write (a mutex locked and unlocked on each); the scheduler, which
  // other threads post to, keeps its own.
  net::io_context ioc{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  // The decisions a remote store is asked for in one turn go out together.
  Turn turn{ioc};
  std::unique_ptr<Acceptor> acceptor;
  std::unique_ptr<Acceptor> decision_acceptor;  // server.decision.listen, when set
  UpstreamPool pool;
  TlsUpstreamPool tls_pool;  // to https:// upstreams
  std::mt19937_64 rng{std::random_device{}()};
  // The loop's coarse clock (steady, milliseconds), moved by the sweep.
  int64_t now_ms = SteadyMs();
  // The policies of a request decided at once (AppliedNow), whose room the
  // next such request reuses.
  std::vector<policy::Applied> applied_now;
  // The open tunnels (a WebSocket relayed, routes[].websocket) and the
  // bodies being streamed: their two sockets, which a drain shuts so that
  // each ends (a tunnel when the drain begins, a body when it runs out),
  // and the slots they hold, whose leases the sweep renews.
  struct TunnelEnds {
    Socket* client;
    Socket* upstream;
    AfterHead::Slots* slots;  // renewed by the loop's sweep; null: none held
    bool tunnel;
  };
  std::list<TunnelEnds*> tunnels;
  std::atomic<int> relaying{0};  // tunnels.size(), for the drain on another loop
  // Shuts both sockets of the tunnels (with `bodies`, of the streamed
  // bodies too), so that each ends; on this loop's thread.
  void ShutRelays(bool bodies) {
    boost::system::error_code ignored;
    for (TunnelEnds* t : tunnels) {
      if (!t->tunnel && !bodies) continue;
      t->client->shutdown(Socket::shutdown_both, ignored);
      t->upstream->shutdown(Socket::shutdown_both, ignored);
    }
  }
};

// The loop's list for the policies of a request decided at once, with
// nothing suspending while it is in use (auth_request's and a single
// check's fast paths): empty, and emptied again when this goes, so that a
// request's policies cost no allocation of their own.
class AppliedNow {
 public:
  explicit AppliedNow(Worker& w) : list_(w.applied_now) { list_.clear(); }
  ~AppliedNow() { list_.clear(); }
  AppliedNow(const AppliedNow&) = delete;
  AppliedNow& operator=(const AppliedNow&) = delete;
  std::vector<policy::Applied>& list() { return list_; }

 private:
  std::vector<policy::Applied>& list_;
};

// Awaits an answer that arrives by callback on another thread (a Redis
// decision): `start(done)` begins the work, in the loop's turn (a remote
// store sends what is asked in one turn together); the coroutine resumes on
// `w`, its own loop, with what `done` was given.
template <typename T, typename Start>
Task<T> Await(Worker& w, Start start) {
  return net::async_initiate<const net::use_awaitable_t<Executor>, void(T)>(
      [&w, start = std::move(start)](auto handler) mutable {
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        const InTurn in_turn(w.turn);
        start([h, &ioc = w.ioc](T value) {
          net::post(ioc, [h, value = std::move(value)]() mutable { (*h)(std::move(value)); });
        });
      },
      kUseAwaitable);
}

inline Deadline::Deadline(Worker& w, Socket& socket) : worker_(w), socket_(socket) {
  self_ = w.deadlines.insert(w.deadlines.end(), this);
}
inline Deadline::~Deadline() { worker_.deadlines.erase(self_); }
inline int64_t Deadline::now_ms() const { return worker_.now_ms; }

inline void Deadline::After(Duration d) {
  expired_ = false;
  // now_ms lags the real time by up to one sweep: adding one sweep makes the
  // timeout never shorter than asked (and at most two sweeps longer).
  at_ms_ = worker_.now_ms + d.CeilMillis() + kSweepMs;
}

// What a handler has of the server for one request.
struct Context {
  ServerState& state;
  Worker& worker;
  // The policies in force when the request came (a copy: a reload while
  // the request waits must not free them).
  std::shared_ptr<const policy::PolicySet> set;
  // The request came over TLS (server.tls, server.decision.tls), and the
  // subject of the client's certificate the listener verified (empty when
  // none: policy::RequestFacts::client_cert).
  bool secure = false;
  std::string_view client_cert;
};

// The decision latency of a verdict that took from `start` until now.
inline void ObserveDecision(Context& ctx, std::chrono::steady_clock::time_point start) {
  ctx.state.metrics.decision_latency().Observe(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                            start)
          .count());
}

// The verdict of the policies that apply to a request when all of them are
// in this process: decided at once into `verdict`, counted in the decision
// latency. False, deciding nothing, when some are in Redis (DecideTimed
// then). No coroutine: a frame nested below the request's own is a malloc
// and a free (Asio keeps one frame per thread for reuse), and the verdict
// is made where it is kept. `applied` must outlive the call.
//
//   policy::Verdict verdict;
//   if (!DecideNow(ctx, applied, verdict)) verdict = co_await DecideTimed(ctx, applied);
inline bool DecideNow(Context& ctx, const std::vector<policy::Applied>& applied,
                      policy::Verdict& verdict) {
  if (!policy::InProcess(applied)) return false;
  const auto start = std::chrono::steady_clock::now();
  verdict = policy::EvaluateNow(applied, ctx.state.clock->Now());
  ObserveDecision(ctx, start);
  return true;
}

// The same for policies some of which are in Redis, suspending for the
// round trip (the coroutine then resumes on the request's loop); it decides
// in-process policies too, through a completion.
inline Task<policy::Verdict> DecideTimed(Context& ctx,
                                         const std::vector<policy::Applied>& applied) {
  const auto start = std::chrono::steady_clock::now();
  const Time now = ctx.state.clock->Now();
  policy::Verdict verdict = co_await Await<policy::Verdict>(
      ctx.worker,
      [&](policy::VerdictCallback done) { policy::Evaluate(applied, now, std::move(done)); });
  ObserveDecision(ctx, start);
  co_return verdict;
}

// Fills `applied` with the policies of ctx.set in `applying`, each with its
// key for a gateway or auth_request request (from `facts` and `route`) and
// its estimated cost; DecideTimed decides them.
inline void ApplyPolicies(const Context& ctx, absl::Span<const policy::Policy* const> applying,
                          const policy::RequestFacts& facts, std::string_view route,
                          std::vector<policy::Applied>& applied) {
  const Config& config = ctx.set->config();
  applied.reserve(applying.size());
  for (const policy::Policy* p : applying) {
    applied.push_back(
        {.policy = p,
         .key = p->KeyFor(facts, route, config.trusted_proxies, config.real_ip_header),
         .cost = p->config().cost.estimate});
  }
}

}  // namespace sluice::server

#endif  // SLUICE_SERVER_LOOP_H_
