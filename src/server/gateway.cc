// The gateway: the policies that match a request decide it; an admitted
// request waits out its shaping delay, then goes to its route's upstream
// over a pooled keep-alive connection, and the upstream's answer comes back
// with the RateLimit fields.
#include "server/gateway.h"

#include <limits>
#include <memory>

#include <boost/asio/connect.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/read_size.hpp>

#include "base/cat.h"
#include "server/forwarding.h"
#include "server/json_body.h"
#include "server/upstream_answer.h"
#include "spdlog/spdlog.h"

namespace sluice::server {
namespace {

namespace beast = boost::beast;
using internal::Cat;
using policy::ErrorBody;
using policy::PolicySet;
using policy::ProblemBody;
using policy::RequestFacts;

// The most one read of an upstream's answer asks for.
constexpr size_t kReadBytes = 64 * 1024;

// A body said to be this long or shorter is read whole before it is
// relayed; a longer one, or one of a length not said (chunked, or ended by
// the connection's end), still coming after its head, goes to the client
// as it comes (Server-Sent Events, downloads, a model's tokens).
constexpr uint64_t kWholeBodyBytes = 1 << 20;

// Whether `p`'s answer, its head read, streams its body (kWholeBodyBytes).
bool StreamsItsBody(AnswerParser& p) {
  if (!p.is_header_done() || p.is_done()) return false;
  const int s = p.get().status;
  if (s / 100 == 1 || s == 204 || s == 304) return false;
  const boost::optional<uint64_t> length = p.content_length();
  return p.chunked() || !length || *length > kWholeBodyBytes;
}

// A failed upstream exchange, logged and counted: 504 on a timeout, else 502.
HttpAnswer UpstreamError(ServerState& state, const RouteConfig& route,
                         const boost::system::error_code& ec, std::string_view kind,
                         const std::string& why = "") {
  const bool timeout = kind == "timeout";
  state.metrics
      .Get("sluice_upstream_errors_total",
           {{"route", route.name}, {"kind", timeout ? "timeout" : std::string(kind)}})
      ->Add();
  const std::string error = why.empty() ? ec.message() : why;
  spdlog::warn("event=upstream_error route={} upstream={} kind={} error=\"{}\"", route.name,
               HostPortText(route.upstream), timeout ? "timeout" : kind, error);
  const int status = timeout ? 504 : 502;
  return HttpAnswer::Problem(
      status, timeout ? "upstream timeout" : "bad gateway",
      Cat("route \"", route.name, "\": upstream ", HostPortText(route.upstream), " ",
          timeout ? "did not answer in time" : Cat("failed: ", error)));
}

// The reply to an answer whose head has come and that goes on after it
// (wire.h, Relayed::after), made from `parser` and `upstream` (taken):
// a 101 to a WebSocket handshake passed on (`upgrade`) becomes a tunnel; a
// body still coming (StreamsItsBody) is streamed, framed for the client
// by ForClientStreamed, the connection going back to the route's pool if
// the body ends whole. False, for a 502: a 101 the client did not ask for
// (relayed, it would leave the client waiting on a protocol that never
// comes), or a body sluice cannot relay as it is coded.
[[gnu::noinline]] bool CarryOn(AnswerParser& parser, std::unique_ptr<UpstreamConnection>& upstream,
                               const RouteConfig& route, const std::string& tls_key, bool upgrade,
                               unsigned client_version, bool client_keep_alive, Reply& reply) {
  namespace http = boost::beast::http;
  if (parser.get().status == 101) {
    const std::optional<std::string_view> said = parser.get().Find(http::field::upgrade);
    if (!upgrade || !said || !SameName(*said, "websocket")) return false;
    Relayed& tunnel = reply.emplace<Relayed>();
    tunnel.answer = parser.release();
    (void)ForClient(tunnel.answer, 11, true, false);  // a 101 has no body to frame
    tunnel.websocket = true;
    tunnel.after = std::make_shared<AfterHead>();
    tunnel.after->upstream = std::move(upstream);
    tunnel.after->idle = route.idle_timeout;
    return true;
  }
  const boost::optional<uint64_t> said = parser.content_length();
  UpstreamAnswer answer = parser.release();  // its head, and the body so far
  parser.get().body.clear();
  bool chunked = false;
  if (!ForClientStreamed(answer, client_version, client_keep_alive,
                         said ? std::optional<uint64_t>(*said) : std::nullopt, chunked)) {
    return false;
  }
  parser.body_limit(boost::none);
  auto after = std::make_shared<AfterHead>();
  after->parser.emplace(std::move(parser));
  after->upstream = std::move(upstream);
  after->pool = route.upstream;
  after->tls_pool = tls_key;
  after->timeout = route.upstream_timeout;
  Relayed& relayed = reply.emplace<Relayed>();
  relayed.answer = std::move(answer);
  relayed.after = std::move(after);
  relayed.body_to_come = true;
  relayed.chunked = chunked;
  return true;
}

// Gives back what a verdict holds of concurrency limits when it goes.
class SlotHold {
 public:
  SlotHold(const std::vector<policy::Applied>& applied, const policy::Verdict& verdict,
           const Clock& clock)
      : applied_(applied), verdict_(verdict), clock_(clock) {}
  SlotHold(const SlotHold&) = delete;
  SlotHold& operator=(const SlotHold&) = delete;
  ~SlotHold() {
    if (active_ && verdict_.allowed && policy::Holds(applied_, verdict_)) {
      policy::Release(applied_, verdict_, clock_.Now());
    }
  }
  // Gives the slots back for now (a shaping delay); whether there were any.
  bool Suspend() {
    if (!verdict_.allowed || !policy::Holds(applied_, verdict_)) return false;
    policy::Release(applied_, verdict_, clock_.Now(), /*observe_hold=*/false);
    active_ = false;
    return true;
  }
  // They are held again (policy::Reacquire).
  void Resume() { active_ = true; }

  // What holds the slots from now on (a tunnel, a streamed body), renewing
  // their leases as it goes on and giving them back when it goes: null
  // when there are none. `applied` and `verdict` are those this was made
  // with, moved; `set` keeps the policies they point into; renewals that a
  // remote store answers on its thread come back to `w`'s loop.
  std::shared_ptr<AfterHead::Slots> Keep(std::vector<policy::Applied> applied,
                                         policy::Verdict verdict,
                                         std::shared_ptr<const PolicySet> set, Worker& w) {
    if (!active_ || !verdict.allowed || !policy::Holds(applied, verdict)) return nullptr;
    active_ = false;
    class Kept final : public AfterHead::Slots, public std::enable_shared_from_this<Kept> {
     public:
      Kept(std::vector<policy::Applied> a, policy::Verdict v, std::shared_ptr<const PolicySet> s,
           const Clock& c, Worker& w)
          : applied_(std::move(a)),
            verdict_(std::move(v)),
            set_(std::move(s)),
            clock_(c),
            worker_(w),
            every_(policy::ShortestLease(applied_, verdict_).micros() / 3),
            last_(c.Now()) {}
      Kept(const Kept&) = delete;
      Kept& operator=(const Kept&) = delete;
      ~Kept() override { policy::Release(applied_, verdict_, clock_.Now()); }
      void Renew(Time now) override {
        if ((now - last_).micros() < wait_) return;
        last_ = now;
        wait_ = every_;
        policy::Renew(applied_, verdict_, now,
                      [self = weak_from_this(), &ioc = worker_.ioc](
                          size_t i, const absl::StatusOr<PolicyDecision>& renewed) {
                        net::post(ioc, [self, i, renewed] {
                          const auto kept = self.lock();
                          if (kept == nullptr) return;
                          if (renewed.ok()) {
                            kept->verdict_.answers[i].decision = *renewed;
                          } else {
                            // The store could not renew it (Redis away for
                            // a moment): again in a tenth of the lease, not
                            // a third, so that an outage shorter than about
                            // two thirds of it loses no slot.
                            kept->wait_ = kept->every_ * 3 / 10;
                          }
                        });
                      });
      }

     private:
      std::vector<policy::Applied> applied_;
      policy::Verdict verdict_;
      std::shared_ptr<const PolicySet> set_;
      const Clock& clock_;
      Worker& worker_;
      const int64_t every_;    // microseconds between renewals
      int64_t wait_ = every_;  // until the next: every_, or less after a failed one
      Time last_;
    };
    return std::make_shared<Kept>(std::move(applied), std::move(verdict), std::move(set), clock_,
                                  w);
  }

 private:
  bool active_ = true;
  const std::vector<policy::Applied>& applied_;
  const policy::Verdict& verdict_;
  const Clock& clock_;
};

// How sending a streamed request body to the upstream ended.
enum class Sent { kWhole, kClientFailed, kUpstreamFailed };

// Sends the body of a request still coming (BodyToCome::Streams) to the
// upstream as it comes from the client, in chunks when it goes `chunked`:
// each wait for the client has server.read_timeout, each write to the
// upstream `timeout`; `slots`, if any, renewed as it comes (every third
// of their lease). kClientFailed: `reply` says what to answer, if anything
// (ReadPart); kUpstreamFailed: `ec` says why.
Task<Sent> SendBody(UpstreamConnection& upstream, BodyToCome& body, bool chunked,
                    Deadline& deadline, Duration timeout, AfterHead::Slots* slots,
                    const Clock& clock, Reply& reply, boost::system::error_code& ec) {
  std::string part, framed;
  for (bool end = false; !end;) {
    deadline.Never();  // a slow client is the client's deadline's
    if (!co_await body.ReadPart(part, end, reply)) co_return Sent::kClientFailed;
    // Its concurrency slots' leases, renewed as the body comes.
    if (slots != nullptr) slots->Renew(clock.Now());
    std::string_view out = part;
    if (chunked) {
      framed.clear();
      if (!part.empty()) AppendChunk(part, framed);
      if (end) AppendChunk({}, framed);
      out = framed;
    }
    if (out.empty()) continue;
    deadline.After(timeout);
    std::array<net::const_buffer, 2> data = {net::buffer(out.data(), out.size()),
                                             net::const_buffer()};
    if (upstream.tls != nullptr) {
      if (!upstream.tls->WriteNow(data, ec) && !ec) co_await upstream.tls->Write(data, ec);
    } else if (!WriteNow(upstream.socket, data, ec) && !ec) {
      co_await net::async_write(upstream.socket, data, net::redirect_error(kUseAwaitable, ec));
    }
    if (ec) co_return Sent::kUpstreamFailed;
  }
  co_return Sent::kWhole;
}

}  // namespace

Task<void> Gateway(Context& ctx, Request& req, const std::string& peer_ip, Reply& reply,
                   BodyToCome* body) {
  Worker& w = ctx.worker;
  const PolicySet* set = ctx.set.get();
  const ServerConfig& sc = set->config().server;
  std::string path_storage, host;
  const std::string method(req.method_string());
  RequestFacts facts = FactsOf(req, peer_ip, method, req.target(), path_storage, host);
  facts.client_cert = ctx.client_cert;
  const RouteConfig* route = set->RouteFor(facts);
  if (route == nullptr) {
    reply =
        HttpAnswer::Problem(404, "not found", Cat("no route matches ", method, " ", facts.path));
    co_return;
  }
  // A POST whose body may name a method a policy limits (`_method`, which
  // Rack, Laravel and Symfony act on) is read before it is decided.
  absl::InlinedVector<std::string, 2> body_methods;
  if (set->MayCountByBodyMethod(facts)) {
    // Read whole, so server.max_body_bytes bounds it whatever the route's.
    if (body != nullptr && !co_await body->Read(reply, sc.max_body_bytes)) co_return;
    body = nullptr;
    body_methods = BodyMethods(req.Find(http::field::content_type), req.body());
    facts.body_methods = body_methods;
  }
  std::vector<policy::Applied> applied;
  ApplyPolicies(ctx, set->Matching(facts), facts, route->name, applied);
  policy::Verdict ev;
  if (!DecideNow(ctx, applied, ev)) ev = co_await DecideTimed(ctx, applied);
  if (!ev.error.ok()) {
    reply = HttpAnswer::Problem(400, "bad request", std::string(ev.error.message()));
    co_return;
  }
  HeaderList headers;
  ev.AppendHeaders(applied, sc.legacy_headers, w.rng, headers);
  // An admitted request holds its concurrency slots until its upstream
  // exchange is over (answered, failed or timed out), however this
  // coroutine ends.
  SlotHold hold(applied, ev, *ctx.state.clock);
  if (!ev.allowed) {
    reply = HttpAnswer{ev.status, "application/problem+json",
                       ProblemBody(ev.status, ev.violated, ev.detail), std::move(headers)};
    co_return;
  }
  if (ev.delay > Duration::Zero()) {  // leaky_bucket shape: hold, then forward
    // Holding no concurrency slot while it waits (docs/concurrency.md).
    const bool slots = hold.Suspend();
    Timer timer(w.ioc.get_executor(), std::chrono::microseconds(ev.delay.micros()));
    boost::system::error_code ec;
    co_await timer.async_wait(net::redirect_error(kUseAwaitable, ec));
    if (slots) {
      const Time now = ctx.state.clock->Now();
      const bool again = co_await Await<bool>(w, [&](std::function<void(bool)> done) {
        policy::Reacquire(applied, ev, now, std::move(done));
      });
      if (!again) {
        HeaderList denied;
        ev.AppendHeaders(applied, sc.legacy_headers, w.rng, denied);
        reply = HttpAnswer{ev.status, "application/problem+json",
                           ProblemBody(ev.status, ev.violated, ev.detail), std::move(denied)};
        co_return;
      }
      hold.Resume();
    }
  }
  // On a route that takes bodies larger than server.max_body_bytes, a body
  // chunked or over kWholeRequestBodyBytes goes as it comes; the rest, and
  // every body on other routes, is read whole first (a body that turns
  // out too large or malformed then never reaches the upstream).
  const bool streamed =
      body != nullptr && route->StreamsUploads(sc.max_body_bytes) && body->Streams();
  const StreamedBody streamed_body{streamed ? body->Length() : std::nullopt};
  if (body != nullptr && !streamed &&
      !co_await body->Read(reply, route->max_body_bytes.value_or(sc.max_body_bytes))) {
    co_return;
  }
  std::string marker;  // Sluice-Shadow-Denied: the shadow policies that would have denied
  for (const std::string& name : ev.shadow_denied) {
    if (!marker.empty()) marker += ", ";
    marker += Cat("\"", name, "\"");
  }
  // A WebSocket handshake on a route that tunnels them: Upgrade and
  // Connection go to the upstream (they are hop-by-hop: ToUpstream drops
  // them), on a connection of its own.
  const bool upgrade = route->websocket && IsWebSocketHandshake(req);
  TargetForUpstream(req, route->upstream);
  if (route->upstream_host) {
    req.Set("Host", HostPortText(route->upstream, route->upstream_tls ? 443 : 80));
  }
  // Forwarded: `reply` is set to the upstream's answer, or to the 502 or
  // 504 of a failed exchange. (Here, not in a coroutine of its own: a frame
  // nested deeper is a malloc and a free per request.)
  const bool client_keep_alive = req.keep_alive();
  const unsigned client_version = req.version();
  const bool head = req.method() == http::verb::head;
  ToUpstream(
      req, peer_ip, marker, sc.underscores_in_headers,
      [&] { return policy::FromTrustedProxy(peer_ip, set->config().trusted_proxies); }, ctx.secure,
      streamed ? &streamed_body : nullptr);
  if (upgrade) {
    req.Set("Connection", "upgrade");
    req.Set("Upgrade", "websocket");
  }

  boost::system::error_code ec;
  const std::string tls_key = route->upstream_tls ? TlsPoolKey(*route) : std::string();
  // An upload's slots, renewed while it comes (and kept by what follows
  // its answer's head, if anything does).
  std::shared_ptr<AfterHead::Slots> upload_slots;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<UpstreamConnection> upstream;
    // (A tunnel, and a body streamed, which cannot be sent again, each on
    // a connection of its own.)
    if (attempt == 0 && !upgrade && !streamed) {
      upstream = route->upstream_tls ? w.tls_pool.Take(tls_key) : w.pool.Take(route->upstream);
    }
    const bool reused = upstream != nullptr;
    if (!reused) upstream = std::make_unique<UpstreamConnection>(Socket(w.ioc.get_executor()));
    Socket& stream = upstream->socket;
    Deadline deadline(w, stream);
    deadline.After(route->upstream_timeout > Duration::Zero() ? route->upstream_timeout
                                                              : sc.upstream_timeout);
    if (!reused) {
      Resolver resolver(w.ioc.get_executor());
      auto endpoints = co_await resolver.async_resolve(route->upstream.host,
                                                       std::to_string(route->upstream.port),
                                                       net::redirect_error(kUseAwaitable, ec));
      if (!ec)
        co_await net::async_connect(stream, endpoints, net::redirect_error(kUseAwaitable, ec));
      std::string why;  // a TLS handshake's failure, in words
      if (!ec && route->upstream_tls) {
        const std::shared_ptr<const ServerState::UpstreamContexts> contexts =
            ctx.state.upstream_tls.load();
        const auto found = contexts->find(route->name);
        if (found == contexts->end()) {
          // A route a reload has just removed, or changed to http://.
          ec = net::error::operation_aborted;
          why = "the route's TLS settings were reloaded meanwhile";
        } else {
          stream.set_option(tcp::no_delay(true), ec);
          const std::string& name = route->upstream_server_name.empty()
                                        ? route->upstream.host
                                        : route->upstream_server_name;
          upstream->tls = std::make_unique<TlsSocket>(stream, *found->second, &name);
          co_await upstream->tls->Handshake(ec);
          if (ec) why = Cat("TLS handshake: ", upstream->tls->Failure(ec));
        }
      }
      if (ec) {
        reply = UpstreamError(ctx.state, *route, ec, deadline.expired() ? "timeout" : "connect",
                              deadline.expired() ? "" : why);
        break;
      }
    }
    upstream->head.clear();
    const std::string_view content = req.AppendHead(upstream->head);
    // (A streamed body's part read so far goes with the rest: SendBody.)
    std::array<net::const_buffer, 2> request =
        Gathered(upstream->head, streamed ? std::string_view() : content);
    if (upstream->tls != nullptr) {
      if (!upstream->tls->WriteNow(request, ec) && !ec) co_await upstream->tls->Write(request, ec);
    } else if (!WriteNow(stream, request, ec) && !ec) {
      co_await net::async_write(stream, request, net::redirect_error(kUseAwaitable, ec));
    }
    if (streamed && !ec) [[unlikely]] {
      const Duration timeout = route->upstream_timeout > Duration::Zero() ? route->upstream_timeout
                                                                          : sc.upstream_timeout;
      if (upload_slots == nullptr) upload_slots = hold.Keep(applied, ev, ctx.set, w);
      body->SetMinRate(route->MinUploadRate());
      const Sent sent = co_await SendBody(*upstream, *body, !streamed_body.length, deadline,
                                          timeout, upload_slots.get(), *ctx.state.clock, reply, ec);
      if (sent == Sent::kClientFailed) {  // the upstream's connection closes
        if (body->TooSlow()) [[unlikely]] {
          ctx.state.metrics.Get("sluice_slow_uploads_total", {{"route", route->name}})->Add();
          spdlog::warn("event=slow_upload route={} peer={} min_upload_rate={}", route->name,
                       peer_ip, route->MinUploadRate());
        }
        co_return;
      }
      // An upstream that stopped taking the body may have answered why.
      ec = {};
      deadline.After(timeout);
    }
    beast::flat_buffer& buffer = upstream->buffer;
    std::optional<AnswerParser> parser;
    // Interim (1xx) answers are read and dropped; the final one is relayed.
    do {
      parser.emplace();
      // No bound on a body said to come: one over kWholeBodyBytes, or of a
      // length not said, streams (StreamsItsBody); one read whole is never
      // longer. (A bound here refused a download said to be over it. Not
      // boost::none: Beast 1.74 compares a said length with it as with a
      // value below every length, and refuses them all.)
      parser->body_limit(std::numeric_limits<uint64_t>::max());
      parser->skip(head);  // a response to HEAD has no body, whatever it says
      while (!ec && !FeedParser(*parser, buffer, ec) && !StreamsItsBody(*parser)) {
        const net::mutable_buffer room = buffer.prepare(beast::read_size(buffer, kReadBytes));
        size_t got = 0;
        // (No co_await inside ?: : g++ 12 miscompiles it.)
        if (upstream->tls != nullptr) {
          got = co_await upstream->tls->ReadSome(room, net::redirect_error(kUseAwaitable, ec));
        } else {
          got = co_await stream.ReadSome(room, net::redirect_error(kUseAwaitable, ec));
        }
        if (ec == net::error::eof) {
          EndOfInput(*parser, ec);
          break;
        }
        if (!ec) buffer.commit(got);
      }
    } while (!ec && parser->get().status >= 100 && parser->get().status < 200 &&
             parser->get().status != 101);
    if (ec) {
      // A pooled connection the upstream closed meanwhile: retry once on a new one.
      if (reused && !deadline.expired()) continue;
      reply = UpstreamError(ctx.state, *route, ec, deadline.expired() ? "timeout" : "exchange");
      break;
    }
    if (parser->get().status == 101 || !parser->is_done()) [[unlikely]] {
      // A WebSocket's switch, or a body still coming: out of line.
      deadline.Never();  // each has its own timeouts (server.cc)
      if (!CarryOn(*parser, upstream, *route, tls_key, upgrade, client_version, client_keep_alive,
                   reply)) {
        reply = UpstreamError(
            ctx.state, *route,
            parser->get().status == 101 ? http::error::bad_status
                                        : http::error::bad_transfer_encoding,
            "exchange",
            parser->get().status == 101 ? "a switch of protocols the client did not ask for" : "");
      }
      break;
    }
    const bool reusable = parser->keep_alive() && buffer.size() == 0;  // the upstream's say
    UpstreamAnswer answer = parser->release();
    if (!ForClient(answer, client_version, client_keep_alive, head)) {
      // The connection is not reused either.
      reply = UpstreamError(ctx.state, *route, http::error::bad_transfer_encoding, "exchange");
      break;
    }
    if (reusable) {
      deadline.Never();
      if (route->upstream_tls) {
        w.tls_pool.Give(tls_key, std::move(upstream));
      } else {
        w.pool.Give(route->upstream, std::move(upstream));
      }
    }
    reply.emplace<Relayed>().answer = std::move(answer);
    break;
  }
  if (HttpAnswer* failed = std::get_if<HttpAnswer>(&reply)) {
    // The upstream did not answer: nothing to settle on, the estimate stands.
    failed->headers.Append(headers);
    co_return;
  }
  Relayed& relayed = std::get<Relayed>(reply);
  const UpstreamAnswer& answer = relayed.answer;
  // The true cost, from the upstream's answer (docs/settled-costs.md).
  policy::SettleCosts(applied, ev, [&answer](std::string_view name) { return answer.Find(name); });
  relayed.fields = std::move(headers);
  if (relayed.after != nullptr) {
    // A tunnel holds the request's concurrency slots while it is open, a
    // streamed body until it has all gone.
    relayed.after->hold = upload_slots != nullptr
                              ? std::move(upload_slots)
                              : hold.Keep(std::move(applied), std::move(ev), ctx.set, w);
  }
}

}  // namespace sluice::server
