#include <utility>  // before Asio: Boost 1.74's awaitable.hpp misses it

#include "redis/client.h"

#include <hiredis/hiredis.h>

#include <array>
#include <charconv>
#include <chrono>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include "base/cat.h"
#include "base/parse_number.h"
#include "tls/context.h"

namespace sluice::redis {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using internal::Cat;
using internal::ParseWhole;
using SteadyClock = std::chrono::steady_clock;

void ReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

std::string Endpoint::ToString() const {
  return socket_path.empty() ? internal::HostAndPort(host, port) : Cat("unix:", socket_path);
}

std::string Command(const std::vector<std::string_view>& args) {
  std::string out;
  AppendCommand(out, args.data(), args.size());
  return out;
}

namespace {

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis
// Cluster specifies for key slots.
constexpr std::array<uint16_t, 256> MakeCrcTable() {
  std::array<uint16_t, 256> table{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<uint16_t>(crc << 1);
    }
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint16_t, 256> kCrcTable = MakeCrcTable();

uint16_t Crc16(std::string_view data) {
  uint16_t crc = 0;
  for (unsigned char c : data) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrcTable[((crc >> 8) ^ c) & 0xff]);
  }
  return crc;
}

constexpr int kSlots = 16384;

std::string_view ReplyText(const redisReply& r) { return {r.str, r.len}; }

// What every TLS connection is made with: the authorities trusted, the
// client's certificate, TLS 1.2 at least, the peer verified.
absl::StatusOr<std::shared_ptr<net::ssl::context>> MakeTlsContext(const TlsOptions& tls) {
  return tls::ClientContext(
      {.cert_file = tls.cert_file, .key_file = tls.key_file, .ca_file = tls.ca_file}, "redis tls");
}

}  // namespace

uint16_t HashSlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) % kSlots;
}

// ---------------------------------------------------------------------------

namespace {

struct Request {
  uint16_t slot = 0;
  std::string command;
  ReplyCallback done;  // null once answered (a timeout answers early)
  ReplyCallback late;  // the reply that comes after the timeout, if wanted
  SteadyClock::time_point deadline;
  int redirects = 0;
};

}  // namespace

class Client::Impl {
 public:
  Impl(ClientOptions options, std::shared_ptr<net::ssl::context> tls)
      : options_(std::move(options)),
        tls_context_(std::move(tls)),
        uses_tls_(tls_context_ != nullptr),
        timeout_(std::chrono::microseconds(options_.timeout.micros())),
        sweep_(ioc_) {
    slot_owner_.fill(-1);
  }

  // -- Called from any thread ------------------------------------------------

  void Send(uint16_t slot, std::string command, ReplyCallback done, ReplyCallback late,
            SteadyClock::time_point deadline) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    auto req = std::make_unique<Request>();
    req->slot = slot;
    req->command = std::move(command);
    req->done = std::move(done);
    req->late = std::move(late);
    req->deadline =
        deadline == SteadyClock::time_point() ? SteadyClock::now() + timeout_ : deadline;
    bool post = false;
    bool stopped = false;
    {
      std::lock_guard<std::mutex> lock(inbox_mu_);
      stopped = stopping_;
      if (!stopped) {
        inbox_.push_back(std::move(req));
        post = !flush_posted_;
        flush_posted_ = true;
      }
    }
    // Answered outside the lock: a callback that sends again must not wait
    // for it.
    if (stopped) return req->done(absl::CancelledError("redis client stopped"));
    // On the client's own thread (a reply's callback sending the next call)
    // the call is written at once, before the reply's other callbacks run:
    // Redis works on it meanwhile, instead of waiting for all of them (with
    // one connection, Redis and the client otherwise take turns). Not
    // from inside such a write: a request failed there, whose callback
    // sends again, goes through the loop.
    if (ioc_.get_executor().running_in_this_thread() && !flushing_now_) {
      flushing_now_ = true;
      Flush();
      flushing_now_ = false;
      return;
    }
    if (post) net::post(ioc_, [this] { Flush(); });
  }

  void After(std::chrono::nanoseconds delay, std::function<void()> fn) {
    {
      // Posted under the lock: Stop, which sets stopping_ under it, posts
      // its own task after this one, and that task runs what is deferred.
      std::lock_guard<std::mutex> lock(inbox_mu_);
      if (!stopping_) {
        net::post(ioc_,
                  [this, delay, fn = std::move(fn)]() mutable { Defer(delay, std::move(fn)); });
        return;
      }
    }
    fn();
  }

  std::chrono::microseconds RoundTrip() const {
    return std::chrono::microseconds(round_trip_us_.load(std::memory_order_relaxed));
  }
  // From when a command was sent to its answer (Dispatch's `last_answer`:
  // no second clock read).
  void NoteRoundTrip(SteadyClock::time_point sent, SteadyClock::time_point answered) {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(answered - sent).count();
    round_trip_us_.store(std::max<int64_t>(us, 1), std::memory_order_relaxed);
  }

  ClientHealth Health() const {
    ClientHealth h;
    h.nodes = masters_.load(std::memory_order_relaxed);
    h.nodes_up = masters_up_.load(std::memory_order_relaxed);
    h.all_slots_covered = covered_.load(std::memory_order_relaxed);
    h.requests = requests_.load(std::memory_order_relaxed);
    h.errors = errors_.load(std::memory_order_relaxed);
    h.timeouts = timeouts_.load(std::memory_order_relaxed);
    h.late_replies = late_replies_.load(std::memory_order_relaxed);
    h.reconnects = reconnects_.load(std::memory_order_relaxed);
    h.redirects = redirects_.load(std::memory_order_relaxed);
    h.topology_refreshes = refreshes_.load(std::memory_order_relaxed);
    h.tls = uses_tls_;
    std::lock_guard lock(server_mu_);
    h.server = server_;
    return h;
  }

  absl::Status Start() {
    thread_ = std::thread([this] {
      auto guard = net::make_work_guard(ioc_);
      ioc_.run();
    });
    if (!options_.sentinel_master.empty()) return StartWithSentinels();
    for (const Endpoint& ep : options_.nodes) {
      // Seeds of a Cluster may be replicas; they serve CLUSTER SLOTS only.
      RunOnIo([&] { NodeFor(ep, /*master=*/!options_.cluster); });
    }
    const auto wait = std::chrono::microseconds(options_.connect_timeout.micros()) +
                      std::chrono::milliseconds(200);
    const std::vector<absl::Status> first = FirstAttempts(0, options_.nodes.size());
    RunOnIo([this] { StartSweep(); });
    if (!options_.cluster) {
      if (!first[0].ok()) return first[0];
      RunOnIo([this] { UpdateCoverage(); });
      return absl::OkStatus();
    }
    // A Cluster: ask a connected seed for the slots.
    absl::Status last = absl::UnavailableError("no seed node");
    for (size_t i = 0; i < options_.nodes.size(); ++i) {
      if (!first[i].ok()) {
        last = first[i];
        continue;
      }
      std::promise<absl::Status> done;
      std::future<absl::Status> f = done.get_future();
      RunOnIo(
          [&] { RefreshSlotsFrom(*nodes_[i], [&done](absl::Status s) { done.set_value(s); }); });
      if (f.wait_for(wait) != std::future_status::ready) {
        last = absl::DeadlineExceededError(
            Cat("redis ", options_.nodes[i].ToString(), ": no answer to CLUSTER SLOTS"));
        continue;
      }
      last = f.get();
      if (last.ok()) break;
    }
    if (!last.ok()) return last;
    // Wait for the masters to connect.
    const auto until = SteadyClock::now() + wait;
    while (SteadyClock::now() < until) {
      if (covered_.load()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!covered_.load()) {
      std::string down = RunOnIo([this] {
                           std::string out;
                           for (const auto& n : nodes_) {
                             if (n->master && n->state != Node::kReady) {
                               out +=
                                   Cat(out.empty() ? "" : ", ", n->endpoint.ToString(),
                                       n->last_error.empty() ? "" : Cat(" (", n->last_error, ")"));
                             }
                           }
                           return out;
                         }).get();
      return absl::UnavailableError(
          Cat("redis cluster: not every slot has a reachable master",
              down.empty() ? std::string() : Cat("; not connected: ", down)));
    }
    return absl::OkStatus();
  }

  // The first attempts of nodes_[from] to nodes_[from + count - 1] to
  // connect: waits until one has succeeded or all have ended, at most the
  // connect timeout (and 200 ms); one still trying then is DeadlineExceeded.
  // A node that does not answer delays nothing while another does.
  std::vector<absl::Status> FirstAttempts(size_t from, size_t count) {
    std::vector<std::future<absl::Status>> pending;
    for (size_t i = from; i < from + count; ++i) {
      pending.push_back(RunOnIo([&] { return nodes_[i]->first_result.get_future(); }).get());
    }
    std::vector<absl::Status> out(count, absl::OkStatus());
    const auto until = SteadyClock::now() +
                       std::chrono::microseconds(options_.connect_timeout.micros()) +
                       std::chrono::milliseconds(200);
    bool any = false;
    size_t ended = 0;
    while (!any && ended < count && SteadyClock::now() < until) {
      for (size_t i = 0; i < count; ++i) {
        if (!pending[i].valid() ||
            pending[i].wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
          continue;
        }
        out[i] = pending[i].get();  // leaves pending[i] invalid
        ++ended;
        any = any || out[i].ok();
      }
      if (!any && ended < count) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (size_t i = 0; i < count; ++i) {
      if (pending[i].valid()) {
        out[i] = absl::DeadlineExceededError(Cat("redis ", nodes_[from + i]->endpoint.ToString(),
                                                 ": no answer within the connect timeout"));
      }
    }
    return out;
  }

  // Sentinel: nodes_[0] is the master (where every call goes), found once
  // a sentinel is connected; the sentinels follow.
  absl::Status StartWithSentinels() {
    RunOnIo([this] {
      nodes_.push_back(std::make_unique<Node>(ioc_));
      nodes_[0]->via_sentinels = true;
      nodes_[0]->endpoint = {options_.sentinel_master, 0, {}};
      for (const Endpoint& ep : options_.nodes) {
        nodes_.push_back(std::make_unique<Node>(ioc_));
        Node& s = *nodes_.back();
        s.endpoint = ep;
        s.master = false;
        s.sentinel = true;
        Connect(s);
      }
      CountMasters();
      StartSweep();
    });
    const auto wait = std::chrono::microseconds(options_.connect_timeout.micros()) +
                      std::chrono::milliseconds(200);
    const std::vector<absl::Status> first = FirstAttempts(1, options_.nodes.size());
    if (std::none_of(first.begin(), first.end(), [](const absl::Status& s) { return s.ok(); })) {
      const std::string message(first.back().message());  // "redis host:port: ..."
      if (!message.starts_with("redis ")) return first.back();
      return absl::Status(first.back().code(),
                          Cat("redis sentinel", std::string_view(message).substr(5)));
    }
    std::future<absl::Status> master = RunOnIo([this] {
                                         Connect(*nodes_[0]);
                                         return nodes_[0]->first_result.get_future();
                                       }).get();
    // The question, then the connection, each within the connect timeout.
    if (master.wait_for(2 * wait) != std::future_status::ready) {
      return absl::DeadlineExceededError(Cat("redis sentinel master \"", options_.sentinel_master,
                                             "\": no answer within the connect timeout"));
    }
    absl::Status connected = master.get();
    RunOnIo([this] { UpdateCoverage(); });
    return connected;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(inbox_mu_);
      stopping_ = true;
    }
    if (thread_.joinable()) {
      RunOnIo([this] {
        stopping_now_ = true;
        sweep_.cancel();
        // What waits for its time runs now, and what it sends is answered
        // Cancelled with the rest.
        while (!deferred_.empty()) {
          std::shared_ptr<Deferred> d = deferred_.back();
          d->timer.cancel();
          RunDeferred(*d);
        }
        for (auto& n : nodes_) Close(*n, absl::CancelledError("redis client stopped"), false);
        Flush();
      }).wait();
      ioc_.stop();
      thread_.join();
    }
  }

  bool OnIoThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  absl::Status ReloadTls(const TlsOptions& tls) {
    if (!uses_tls_ || !tls.enabled) return absl::OkStatus();
    absl::StatusOr<std::shared_ptr<net::ssl::context>> made = MakeTlsContext(tls);
    if (!made.ok()) return made.status();
    RunOnIo([&] {
      tls_context_ = *std::move(made);
      options_.tls = tls;
    }).wait();
    return absl::OkStatus();
  }
  const ClientOptions& options() const { return options_; }

 private:
  struct Entry {
    enum Kind { kUser, kDiscard, kHandshake, kInternal };
    Kind kind = kUser;
    std::unique_ptr<Request> req;                         // kUser
    std::function<void(absl::StatusOr<Reply>)> internal;  // kHandshake, kInternal
    std::string what;                                     // kInternal: the command, for its timeout
    SteadyClock::time_point sent;                         // when it was queued on this node
    SteadyClock::time_point deadline;  // its own: entries are not in deadline order
  };

  // One connection: its socket and, with TLS, the TLS layer over it.
  // Shared with the handlers of its reads and writes: a closed
  // connection's TLS layer lives until the last of them has run.
  struct Link {
    explicit Link(net::io_context& ioc) : socket(ioc), local(ioc) {}
    tcp::socket socket;
    std::optional<net::ssl::stream<tcp::socket&>> tls;
    std::shared_ptr<net::ssl::context> tls_context;  // what `tls` was made with
    net::local::stream_protocol::socket local;       // a Unix socket, instead

    // Runs op(stream) on the stream the connection reads and writes.
    template <typename Op>
    void On(Op&& op) {
      if (tls) return op(*tls);
      if (local.is_open()) return op(local);
      op(socket);
    }
    void Close() {
      boost::system::error_code ignored;
      socket.close(ignored);
      local.close(ignored);
    }
  };

  struct Node {
    explicit Node(net::io_context& ioc) : retry(ioc) {}
    Endpoint endpoint;
    bool master = true;
    bool sentinel = false;       // a sentinel, asked which server is the master
    bool via_sentinels = false;  // the master, found by asking the sentinels
    enum State { kDown, kConnecting, kReady } state = kDown;
    std::shared_ptr<Link> link;  // null before the first connect
    net::steady_timer retry;
    uint64_t generation = 0;  // bumped on close: stale handlers see it and stop
    std::string out;          // commands waiting for the write in progress
    std::string writing;
    bool write_active = false;
    std::array<char, 16 * 1024> in{};
    redisReader* reader = nullptr;
    std::deque<Entry> pending;
    int handshake_left = 0;
    // When the node last answered (or, before any answer, connected).
    SteadyClock::time_point last_answer{};
    std::chrono::milliseconds backoff{0};
    std::string last_error;
    std::string last_logged;  // the last failed reconnect's reason logged
    bool ever_ready = false;
    bool first_reported = false;
    std::promise<absl::Status> first_result;
  };

  template <typename F>
  auto RunOnIo(F&& f) -> std::future<decltype(f())> {
    using R = decltype(f());
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
    std::future<R> fut = task->get_future();
    if (OnIoThread()) {
      (*task)();
    } else {
      net::post(ioc_, [task] { (*task)(); });
    }
    if constexpr (std::is_void_v<R>) {
      if (!OnIoThread()) fut.wait();
    }
    return fut;
  }

  // -- On the I/O thread -------------------------------------------------------

  // A function After() runs on this thread once its delay has passed.
  struct Deferred {
    Deferred(net::io_context& ioc, std::function<void()> f) : timer(ioc), fn(std::move(f)) {}
    net::steady_timer timer;
    std::function<void()> fn;  // empty once run
  };

  void Defer(std::chrono::nanoseconds delay, std::function<void()> fn) {
    auto d = std::make_shared<Deferred>(ioc_, std::move(fn));
    if (stopping_now_) return RunDeferred(*d);
    deferred_.push_back(d);
    d->timer.expires_after(delay);
    d->timer.async_wait([this, d](const boost::system::error_code&) { RunDeferred(*d); });
  }

  void RunDeferred(Deferred& d) {
    if (!d.fn) return;
    std::function<void()> fn = std::exchange(d.fn, nullptr);
    std::erase_if(deferred_, [&d](const std::shared_ptr<Deferred>& x) { return x.get() == &d; });
    fn();
  }

  void Flush() {
    std::vector<std::unique_ptr<Request>> batch;
    {
      std::lock_guard<std::mutex> lock(inbox_mu_);
      batch.swap(inbox_);
      flush_posted_ = false;
    }
    for (auto& req : batch) Route(std::move(req));
    for (auto& n : nodes_) StartWrite(*n);
  }

  Node* Owner(uint16_t slot) {
    if (!options_.cluster) return nodes_.empty() ? nullptr : nodes_[0].get();
    const int i = slot_owner_[slot];
    return i < 0 ? nullptr : nodes_[i].get();
  }

  void Route(std::unique_ptr<Request> req) {
    if (stopping_now_) return Fail(*req, absl::CancelledError("redis client stopped"));
    Node* node = Owner(req->slot);
    if (node == nullptr) {
      RefreshSoon();
      return Fail(*req, absl::UnavailableError(
                            Cat("redis cluster: slot ", req->slot, " has no known master")));
    }
    Enqueue(*node, std::move(req));
  }

  void Enqueue(Node& node, std::unique_ptr<Request> req) {
    if (node.state != Node::kReady) {
      if (options_.cluster) RefreshSoon();
      return Fail(*req, absl::UnavailableError(
                            Cat("redis ", node.endpoint.ToString(), ": not connected",
                                node.last_error.empty() ? "" : Cat(" (", node.last_error, ")"))));
    }
    node.out += req->command;
    Entry e;
    e.kind = Entry::kUser;
    e.sent = SteadyClock::now();
    e.deadline = req->deadline;
    e.req = std::move(req);
    node.pending.push_back(std::move(e));
  }

  void Fail(Request& req, absl::Status status) {
    if (!req.done) return;
    if (absl::IsDeadlineExceeded(status)) {
      timeouts_.fetch_add(1, std::memory_order_relaxed);
    } else {
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
    ReplyCallback done = std::move(req.done);
    req.done = nullptr;
    done(std::move(status));
  }

  Node& NodeFor(const Endpoint& ep, bool master) {
    for (auto& n : nodes_) {
      if (n->endpoint == ep) {
        if (master && !n->master) {
          n->master = true;
          CountMasters();
        }
        return *n;
      }
    }
    nodes_.push_back(std::make_unique<Node>(ioc_));
    Node& n = *nodes_.back();
    n.endpoint = ep;
    n.master = master;
    CountMasters();
    Connect(n);
    return n;
  }

  void CountMasters() {
    int masters = 0;
    int up = 0;
    for (const auto& n : nodes_) {
      if (!n->master) continue;
      ++masters;
      if (n->state == Node::kReady) ++up;
    }
    masters_.store(masters, std::memory_order_relaxed);
    masters_up_.store(up, std::memory_order_relaxed);
  }

  void ReportFirst(Node& n, absl::Status status) {
    if (n.first_reported) return;
    n.first_reported = true;
    n.first_result.set_value(std::move(status));
  }

  void Connect(Node& n) {
    if (n.via_sentinels) return AskSentinels(n, 0, "");
    ConnectTo(n);
  }

  // The master of a Sentinel setup: the first ready sentinel from
  // nodes_[next] on names it (SENTINEL GET-MASTER-ADDR-BY-NAME), then the
  // connection is made; a sentinel that cannot name it passes the question
  // to the next. None: the node is closed, and asked again after its backoff.
  void AskSentinels(Node& n, size_t next, std::string errors) {
    n.state = Node::kConnecting;
    const uint64_t gen = ++n.generation;
    const bool asked =
        AskForMaster(next, [this, &n, gen, errors](size_t i, absl::StatusOr<Endpoint> master) {
          if (gen != n.generation) return;
          if (!master.ok()) {
            return AskSentinels(n, i + 1,
                                Cat(errors, errors.empty() ? "" : "; ", master.status().message()));
          }
          if (n.endpoint != *master) {
            if (n.ever_ready) {
              Log(false, Cat("event=redis_sentinel_master master=", master->ToString(),
                             " previous=", n.endpoint.ToString()));
            }
            n.endpoint = *master;
          }
          ConnectTo(n);
        });
    if (asked) return;
    Close(n, absl::UnavailableError(Cat("redis sentinel: no sentinel named the master \"",
                                        options_.sentinel_master, "\"",
                                        errors.empty() ? " (none connected)" : Cat(": ", errors))));
  }

  // Asks the first ready sentinel from nodes_[from] on which server is the
  // master; `then` gets its index and its answer. False: none is ready.
  bool AskForMaster(size_t from, std::function<void(size_t, absl::StatusOr<Endpoint>)> then) {
    for (size_t i = from; i < nodes_.size(); ++i) {
      Node& s = *nodes_[i];
      if (!s.sentinel || s.state != Node::kReady) continue;
      SendInternal(s, {"SENTINEL", "GET-MASTER-ADDR-BY-NAME", options_.sentinel_master},
                   [this, i, then = std::move(then), who = s.endpoint.ToString()](
                       absl::StatusOr<Reply> r) { then(i, MasterNamed(r, who)); });
      return true;
    }
    return false;
  }

  // A sentinel's answer to GET-MASTER-ADDR-BY-NAME: [host, port], or nil
  // for a name it does not monitor.
  absl::StatusOr<Endpoint> MasterNamed(const absl::StatusOr<Reply>& r, const std::string& who) {
    if (!r.ok()) return r.status();
    const redisReply& a = **r;
    if (a.type != REDIS_REPLY_ARRAY || a.elements != 2 ||
        a.element[0]->type != REDIS_REPLY_STRING || a.element[1]->type != REDIS_REPLY_STRING) {
      return absl::NotFoundError(
          Cat("sentinel ", who, " does not monitor \"", options_.sentinel_master, "\""));
    }
    Endpoint ep;
    ep.host = std::string(ReplyText(*a.element[0]));
    if (ep.host.empty() || !ParseWhole(ReplyText(*a.element[1]), ep.port) || ep.port == 0) {
      return absl::InternalError(Cat("sentinel ", who, ": a malformed master address"));
    }
    return ep;
  }

  // Every second while the master is up: a failover that the connection
  // outlived (a partition, a demoted master that keeps its clients) moves
  // to the server the sentinels name now.
  void CheckSentinels() {
    Node& n = *nodes_[0];
    AskForMaster(0, [this, &n, gen = n.generation](size_t, absl::StatusOr<Endpoint> master) {
      if (gen != n.generation || n.state != Node::kReady) return;
      if (master.ok() && *master != n.endpoint) {
        Close(n, absl::UnavailableError(Cat("redis ", n.endpoint.ToString(),
                                            ": the sentinels name another master, ",
                                            master->ToString())));
      }
    });
  }

  void ConnectTo(Node& n) {
    n.state = Node::kConnecting;
    const uint64_t gen = ++n.generation;
    n.link = std::make_shared<Link>(ioc_);
    // The whole handshake must finish within the connect timeout.
    n.retry.expires_after(std::chrono::microseconds(options_.connect_timeout.micros()));
    n.retry.async_wait([this, &n, gen](boost::system::error_code ec) {
      if (ec || gen != n.generation || n.state == Node::kReady) return;
      Close(n, absl::DeadlineExceededError(
                   Cat("redis ", n.endpoint.ToString(), ": no answer within the connect timeout")));
    });
    if (!n.endpoint.socket_path.empty()) {
      n.link->local.async_connect(
          net::local::stream_protocol::endpoint(n.endpoint.socket_path),
          [this, &n, gen](boost::system::error_code ec) {
            if (gen != n.generation) return;
            if (ec) {
              return Close(n, absl::UnavailableError(Cat("redis ", n.endpoint.ToString(),
                                                         ": connect: ", ec.message())));
            }
            OnConnected(n);
          });
      return;
    }
    boost::system::error_code ec;
    const net::ip::address address = net::ip::make_address(n.endpoint.host, ec);
    auto connect_to = [this, &n, gen](std::vector<tcp::endpoint> targets) {
      if (targets.empty()) {
        return Close(n, absl::UnavailableError(
                            Cat("redis ", n.endpoint.ToString(), ": the name has no address")));
      }
      auto shared = std::make_shared<std::vector<tcp::endpoint>>(std::move(targets));
      net::async_connect(
          n.link->socket, *shared,
          [this, &n, gen, shared](boost::system::error_code ec, const tcp::endpoint&) {
            if (gen != n.generation) return;
            if (ec) {
              return Close(n, absl::UnavailableError(Cat("redis ", n.endpoint.ToString(),
                                                         ": connect: ", ec.message())));
            }
            boost::system::error_code ignored;
            n.link->socket.set_option(tcp::no_delay(true), ignored);
            if (tls_context_ != nullptr) return StartTls(n);
            OnConnected(n);
          });
    };
    if (!ec) {
      connect_to({tcp::endpoint(address, n.endpoint.port)});
      return;
    }
    auto resolver = std::make_shared<tcp::resolver>(ioc_);
    resolver->async_resolve(
        n.endpoint.host, std::to_string(n.endpoint.port),
        [this, &n, gen, resolver, connect_to](boost::system::error_code ec,
                                              tcp::resolver::results_type results) {
          if (gen != n.generation) return;
          if (ec) {
            return Close(n, absl::UnavailableError(
                                Cat("redis ", n.endpoint.ToString(), ": resolve: ", ec.message())));
          }
          std::vector<tcp::endpoint> targets;
          for (const auto& r : results) targets.push_back(r.endpoint());
          connect_to(std::move(targets));
        });
  }

  // The TLS handshake, within the connect timeout as the rest: the node's
  // certificate must chain to a trusted authority and carry the expected
  // name (the node's host, or TlsOptions::server_name for every node).
  void StartTls(Node& n) {
    n.link->tls_context = tls_context_;
    auto& tls = n.link->tls.emplace(n.link->socket, *tls_context_);
    SSL* ssl = tls.native_handle();
    const std::string& name =
        options_.tls.server_name.empty() ? n.endpoint.host : options_.tls.server_name;
    if (!tls::ExpectPeerName(ssl, name)) {
      return Close(n, absl::InvalidArgumentError(Cat("redis ", n.endpoint.ToString(),
                                                     ": TLS: cannot verify the name \"", name,
                                                     "\": ", tls::OpenSslReason("not a name"))));
    }
    const uint64_t gen = n.generation;
    tls.async_handshake(net::ssl::stream_base::client, [this, &n, gen, link = n.link](
                                                           boost::system::error_code ec) {
      if (gen != n.generation) return;
      if (ec) {
        return Close(n, absl::UnavailableError(
                            Cat("redis ", n.endpoint.ToString(), ": TLS handshake: ",
                                tls::HandshakeFailure(link->tls->native_handle(), ec.message()))));
      }
      OnConnected(n);
    });
  }

  void OnConnected(Node& n) {
    n.reader = redisReaderCreate();
    n.last_answer = SteadyClock::now();
    StartRead(n);
    // The handshake, in two steps: AUTH, SELECT and PING, then, once all
    // three are answered well, the rest (CLUSTER MYID, the function
    // libraries); the node is ready when every answer is good. Redis drops
    // a client that sends a large argument (a library) before it is
    // authenticated, possibly before its refusal of the password is read:
    // sent after PING's answer, the libraries find the client authenticated,
    // and a wrong or missing password is reported as Redis said it
    // (WRONGPASS, NOAUTH), never as the dropped connection.
    const auto deadline =
        SteadyClock::now() + std::chrono::microseconds(options_.connect_timeout.micros());
    const std::string& user = n.sentinel ? options_.sentinel_user : options_.user;
    const std::string& password = n.sentinel ? options_.sentinel_password : options_.password;
    if (!password.empty()) {
      if (user.empty()) {
        AddHandshake(n, {"AUTH", password}, deadline, Step(n, "AUTH"));
      } else {
        AddHandshake(n, {"AUTH", user, password}, deadline, Step(n, "AUTH"));
      }
    }
    if (options_.database != 0 && !options_.cluster && !n.sentinel) {
      const std::string db = std::to_string(options_.database);
      AddHandshake(n, {"SELECT", db}, deadline, Step(n, "SELECT " + db));
    }
    auto pinged = Step(n, "PING");
    AddHandshake(n, {"PING"}, deadline,
                 [this, &n, gen = n.generation, deadline, pinged,
                  sent = SteadyClock::now()](absl::StatusOr<Reply> r) {
                   if (r.ok()) NoteRoundTrip(sent, n.last_answer);
                   // (The rest goes first: the node must not be ready yet.)
                   if (r.ok() && gen == n.generation) SetUp(n, deadline);
                   pinged(std::move(r));
                 });
    StartWrite(n);
  }

  // A step of the handshake: a failure closes the node with `what` named;
  // the last good answer makes it ready.
  std::function<void(absl::StatusOr<Reply>)> Step(Node& n, std::string what) {
    return [this, &n, gen = n.generation, what = std::move(what)](absl::StatusOr<Reply> r) {
      if (gen != n.generation) return;
      if (!r.ok()) {
        return Close(n, absl::Status(r.status().code(), Cat("redis ", n.endpoint.ToString(), ": ",
                                                            what, ": ", r.status().message())));
      }
      if (--n.handshake_left == 0) OnReady(n);
    };
  }

  void AddHandshake(Node& n, std::vector<std::string_view> args, SteadyClock::time_point deadline,
                    std::function<void(absl::StatusOr<Reply>)> then) {
    n.out += Command(args);
    Entry e;
    e.kind = Entry::kHandshake;
    e.sent = SteadyClock::now();
    e.deadline = deadline;
    e.internal = std::move(then);
    n.pending.push_back(std::move(e));
    ++n.handshake_left;
  }

  // The handshake's second step, on an authenticated connection.
  void SetUp(Node& n, SteadyClock::time_point deadline) {
    if (!options_.cluster && !n.sentinel) {
      // Every decision writes: the one server must be a master, not a
      // replica (a URL that names one, a master demoted since, a name whose
      // address moved to the new master after a failover, one the
      // sentinels named before they heard of a failover). A server that
      // does not answer ROLE (renamed away) is taken at its word.
      AddHandshake(n, {"ROLE"}, deadline, [this, &n, gen = n.generation](absl::StatusOr<Reply> r) {
        if (gen != n.generation) return;
        if (r.ok() && (*r)->type == REDIS_REPLY_ARRAY && (*r)->elements > 0 &&
            ReplyText(*(*r)->element[0]) != "master") {
          return Close(
              n, absl::FailedPreconditionError(
                     Cat("redis ", n.endpoint.ToString(), ": a ",
                         ReplyText(*(*r)->element[0]) == "slave" ? std::string_view("replica")
                                                                 : ReplyText(*(*r)->element[0]),
                         ", not a master (ROLE)",
                         n.via_sentinels ? ", though the sentinels named it"
                                         : ": every decision writes")));
        }
        if (--n.handshake_left == 0) OnReady(n);
      });
    }
    if (!options_.cluster && !n.sentinel) {
      // A Cluster node given as one server would answer MOVED for most keys.
      AddHandshake(n, {"CLUSTER", "MYID"}, deadline,
                   [this, &n, gen = n.generation](absl::StatusOr<Reply> r) {
                     if (gen != n.generation) return;
                     if (r.ok()) {
                       return Close(n, absl::InvalidArgumentError(Cat(
                                           "redis ", n.endpoint.ToString(),
                                           " is a Redis Cluster node: use store.redis.cluster")));
                     }
                     if (--n.handshake_left == 0) OnReady(n);
                   });
    }
    if (n.master) {
      for (const std::string& library : options_.functions) {
        auto then = Step(n, "FUNCTION LOAD");
        AddHandshake(
            n, {"FUNCTION", "LOAD", "REPLACE", library}, deadline, [then](absl::StatusOr<Reply> r) {
              if (!r.ok() &&
                  r.status().message().find("unknown command") != std::string_view::npos) {
                r = absl::FailedPreconditionError(
                    Cat(r.status().message(), " (Redis functions need Redis 7.0 or later)"));
              }
              then(std::move(r));
            });
      }
    }
    StartWrite(n);
  }

  void OnReady(Node& n) {
    if (!options_.cluster && !n.sentinel) {
      std::lock_guard lock(server_mu_);
      server_ = n.endpoint.ToString();
    }
    n.state = Node::kReady;
    n.backoff = std::chrono::milliseconds(0);
    n.last_error.clear();
    n.last_logged.clear();
    n.retry.cancel();
    if (n.ever_ready) {
      reconnects_.fetch_add(1, std::memory_order_relaxed);
      Log(false, Cat("event=redis_reconnected node=", n.endpoint.ToString()));
    }
    n.ever_ready = true;
    ReportFirst(n, absl::OkStatus());
    CountMasters();
    UpdateCoverage();
  }

  void Close(Node& n, absl::Status why, bool reconnect = true) {
    ++n.generation;
    const bool was_ready = n.state == Node::kReady;
    n.state = Node::kDown;
    n.last_error = std::string(why.message());
    if (n.link != nullptr) n.link->Close();
    n.retry.cancel();
    if (n.reader != nullptr) {
      redisReaderFree(n.reader);
      n.reader = nullptr;
    }
    n.out.clear();
    n.writing.clear();
    n.write_active = false;
    n.handshake_left = 0;
    std::deque<Entry> pending;
    pending.swap(n.pending);
    const absl::Status lost = absl::UnavailableError(std::string(why.message()));
    for (Entry& e : pending) {
      if (e.kind == Entry::kUser) Fail(*e.req, stopping_now_ ? why : lost);
      if (e.kind == Entry::kInternal && e.internal) std::exchange(e.internal, nullptr)(lost);
    }
    ReportFirst(n, why);
    CountMasters();
    UpdateCoverage();
    if (was_ready && !stopping_now_) {
      Log(true, Cat("event=redis_disconnected node=", n.endpoint.ToString(), " error=\"",
                    why.message(), "\""));
    } else if (n.ever_ready && !stopping_now_ && why.message() != n.last_logged) {
      // Why the node cannot be reached again (a certificate, a password, a
      // replica), each reason once: reconnects are tried every 400 ms.
      n.last_logged = std::string(why.message());
      Log(true, Cat("event=redis_reconnect_failed node=", n.endpoint.ToString(), " error=\"",
                    why.message(), "\""));
    }
    if (was_ready && options_.cluster) RefreshSoon();
    if (!reconnect || stopping_now_) return;
    n.backoff = n.backoff.count() == 0 ? std::chrono::milliseconds(25)
                                       : std::min(n.backoff * 2, std::chrono::milliseconds(400));
    const uint64_t gen = n.generation;
    n.retry.expires_after(n.backoff);
    n.retry.async_wait([this, &n, gen](boost::system::error_code ec) {
      if (ec || gen != n.generation || stopping_now_) return;
      Connect(n);
    });
  }

  void StartWrite(Node& n) {
    if (n.write_active || n.out.empty() || n.state == Node::kDown) return;
    n.write_active = true;
    n.writing.swap(n.out);
    n.out.clear();
    const uint64_t gen = n.generation;
    auto written = [this, &n, gen, link = n.link](boost::system::error_code ec, size_t) {
      if (gen != n.generation) return;
      n.write_active = false;
      n.writing.clear();
      if (ec) {
        return Close(n, absl::UnavailableError(
                            Cat("redis ", n.endpoint.ToString(), ": write: ", ec.message())));
      }
      StartWrite(n);
    };
    n.link->On([&](auto& stream) {
      net::async_write(stream, net::buffer(n.writing), std::move(written));
    });
  }

  void StartRead(Node& n) {
    const uint64_t gen = n.generation;
    auto read = [this, &n, gen, link = n.link](boost::system::error_code ec, size_t size) {
      if (gen != n.generation) return;
      if (ec) {
        return Close(n, absl::UnavailableError(
                            Cat("redis ", n.endpoint.ToString(), ": ",
                                ec == net::error::eof || ec == net::ssl::error::stream_truncated
                                    ? "connection closed by the server"
                                    : Cat("read: ", ec.message()))));
      }
      if (redisReaderFeed(n.reader, n.in.data(), size) != REDIS_OK) {
        return Close(n,
                     absl::InternalError(Cat("redis ", n.endpoint.ToString(), ": protocol error")));
      }
      for (;;) {
        void* raw = nullptr;
        if (redisReaderGetReply(n.reader, &raw) != REDIS_OK) {
          return Close(n, absl::InternalError(Cat("redis ", n.endpoint.ToString(),
                                                  ": protocol error: ", n.reader->errstr)));
        }
        if (raw == nullptr) break;
        Dispatch(n, Reply(static_cast<redisReply*>(raw)));
        if (gen != n.generation) return;  // the reply closed the connection
      }
      for (auto& node : nodes_) StartWrite(*node);
      StartRead(n);
    };
    n.link->On([&](auto& stream) { stream.async_read_some(net::buffer(n.in), std::move(read)); });
  }

  void Dispatch(Node& n, Reply reply) {
    if (n.pending.empty()) {
      return Close(n, absl::InternalError(
                          Cat("redis ", n.endpoint.ToString(), ": a reply nobody asked for")));
    }
    Entry e = std::move(n.pending.front());
    n.pending.pop_front();
    n.last_answer = SteadyClock::now();
    const bool error = reply->type == REDIS_REPLY_ERROR;
    switch (e.kind) {
      case Entry::kDiscard:
        return;
      case Entry::kHandshake:
      case Entry::kInternal:
        if (!e.internal) return;  // answered already (timed out)
        if (error) return e.internal(absl::UnknownError(std::string(ReplyText(*reply))));
        return e.internal(std::move(reply));
      case Entry::kUser:
        NoteRoundTrip(e.sent, n.last_answer);
        break;
    }
    Request& req = *e.req;
    if (!req.done) {      // answered already: it timed out, and ran after all
      if (error) return;  // MOVED, ASK, no function: it did not run
      late_replies_.fetch_add(1, std::memory_order_relaxed);
      if (req.late) std::exchange(req.late, nullptr)(std::move(reply));
      return;
    }
    if (!error) {
      ReplyCallback done = std::move(req.done);
      req.done = nullptr;
      return done(std::move(reply));
    }
    const std::string_view text = ReplyText(*reply);
    if (text.starts_with("MOVED ") || text.starts_with("ASK ")) {
      return Redirect(std::move(e.req), text);
    }
    if (text.starts_with("ERR Function not found")) return Reload(n, std::move(e.req));
    if (text.starts_with("READONLY") || text.starts_with("CLUSTERDOWN") ||
        text.starts_with("TRYAGAIN") || text.starts_with("MASTERDOWN") ||
        text.starts_with("LOADING")) {
      if (options_.cluster) RefreshSoon();
      absl::Status status =
          absl::UnavailableError(Cat("redis ", n.endpoint.ToString(), ": ", text));
      Fail(req, status);
      // The one server has become a replica (a failover): connect again,
      // to where its name or the sentinels point now.
      if (!options_.cluster && text.starts_with("READONLY")) Close(n, status);
      return;
    }
    Fail(req, absl::UnknownError(Cat("redis ", n.endpoint.ToString(), ": ", text)));
  }

  // -MOVED <slot> <host:port> / -ASK <slot> <host:port>.
  void Redirect(std::unique_ptr<Request> req, std::string_view text) {
    const bool ask = text.starts_with("ASK ");
    text.remove_prefix(ask ? 4 : 6);
    const size_t space = text.find(' ');
    uint32_t slot = 0;
    Endpoint target;
    const size_t colon = text.rfind(':');
    if (space == std::string_view::npos || colon == std::string_view::npos || colon < space ||
        !ParseWhole(text.substr(0, space), slot) || slot >= kSlots ||
        !ParseWhole(text.substr(colon + 1), target.port)) {
      return Fail(*req, absl::InternalError(Cat("redis: a redirection not understood: ", text)));
    }
    target.host = std::string(text.substr(space + 1, colon - space - 1));
    if (!target.host.empty() && target.host.front() == '[') {
      target.host = target.host.substr(1, target.host.size() - 2);
    }
    redirects_.fetch_add(1, std::memory_order_relaxed);
    if (++req->redirects > 5) {
      return Fail(*req, absl::UnavailableError(
                            Cat("redis cluster: slot ", slot, " redirected more than 5 times")));
    }
    Node& node = NodeFor(target, /*master=*/true);
    if (ask) {
      // Once, to that node, after ASKING; the slot map stays as it is.
      if (node.state != Node::kReady) {
        return Fail(*req, absl::UnavailableError(
                              Cat("redis ", target.ToString(), ": not connected (ASK)")));
      }
      node.out += Command({"ASKING"});
      Entry asking;
      asking.kind = Entry::kDiscard;
      asking.sent = SteadyClock::now();
      asking.deadline = req->deadline;
      node.pending.push_back(std::move(asking));
      return Enqueue(node, std::move(req));
    }
    slot_owner_[slot] = IndexOf(node);
    RefreshSoon();
    Enqueue(node, std::move(req));
  }

  // The node lost its functions (FUNCTION FLUSH, a restart without
  // persistence): load them again, then resend the call behind them on the
  // same connection.
  void Reload(Node& n, std::unique_ptr<Request> req) {
    if (options_.functions.empty() || ++req->redirects > 5) {
      return Fail(*req, absl::UnknownError(
                            Cat("redis ", n.endpoint.ToString(), ": ERR Function not found")));
    }
    for (const std::string& library : options_.functions) {
      n.out += Command({"FUNCTION", "LOAD", "REPLACE", library});
      Entry load;
      load.kind = Entry::kDiscard;
      load.sent = SteadyClock::now();
      load.deadline = req->deadline;
      n.pending.push_back(std::move(load));
    }
    Enqueue(n, std::move(req));
  }

  int IndexOf(const Node& node) const {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].get() == &node) return static_cast<int>(i);
    }
    return -1;
  }

  void Log(bool warning, const std::string& line) {
    if (options_.log) options_.log(warning, line);
  }

  // -- Cluster topology --------------------------------------------------------

  void RefreshSoon() {
    if (!options_.cluster || refresh_in_flight_ || stopping_now_) return;
    const auto now = SteadyClock::now();
    if (now - last_refresh_ < std::chrono::milliseconds(100)) return;
    for (auto& n : nodes_) {
      if (n->state == Node::kReady) {
        refresh_in_flight_ = true;
        last_refresh_ = now;
        RefreshSlotsFrom(*n, [this](absl::Status) { refresh_in_flight_ = false; });
        return;
      }
    }
  }

  void RefreshSlotsFrom(Node& n, std::function<void(absl::Status)> done) {
    refreshes_.fetch_add(1, std::memory_order_relaxed);
    if (n.state != Node::kReady) {
      return done(absl::UnavailableError(Cat("redis ", n.endpoint.ToString(), ": not connected")));
    }
    const std::string who = n.endpoint.ToString();
    SendInternal(
        n, {"CLUSTER", "SLOTS"}, [this, who, done = std::move(done)](absl::StatusOr<Reply> r) {
          if (!r.ok()) {
            const std::string m(r.status().message());
            return done(absl::Status(
                r.status().code(),
                m.find("cluster support disabled") != std::string::npos
                    ? Cat("redis ", who, " is not a Cluster node (", m, "): use store.redis.url")
                    : Cat("redis ", who, ": CLUSTER SLOTS: ", m)));
          }
          done(ApplySlots(**r, who));
        });
  }

  // A command of the client's own on a ready connection (CLUSTER SLOTS,
  // SENTINEL ...): `then` gets its reply, or an error within the connect
  // timeout.
  void SendInternal(Node& n, std::vector<std::string_view> args,
                    std::function<void(absl::StatusOr<Reply>)> then) {
    n.out += Command(args);
    Entry e;
    e.kind = Entry::kInternal;
    e.what = Cat(args[0], args.size() > 1 ? Cat(" ", args[1]) : "");
    e.sent = SteadyClock::now();
    e.deadline = e.sent + std::chrono::microseconds(options_.connect_timeout.micros());
    e.internal = std::move(then);
    n.pending.push_back(std::move(e));
    StartWrite(n);
  }

  // CLUSTER SLOTS: [[start, end, [host, port, id], replicas...], ...]
  absl::Status ApplySlots(const redisReply& r, const std::string& who) {
    if (r.type != REDIS_REPLY_ARRAY) {
      return absl::InternalError(Cat("redis ", who, ": CLUSTER SLOTS: not an array"));
    }
    if (r.elements == 0) {
      return absl::UnavailableError(Cat("redis ", who, ": the Cluster has no slots assigned"));
    }
    std::array<int, kSlots> owner;
    owner.fill(-1);
    for (size_t i = 0; i < r.elements; ++i) {
      const redisReply& range = *r.element[i];
      if (range.type != REDIS_REPLY_ARRAY || range.elements < 3 ||
          range.element[0]->type != REDIS_REPLY_INTEGER ||
          range.element[1]->type != REDIS_REPLY_INTEGER ||
          range.element[2]->type != REDIS_REPLY_ARRAY || range.element[2]->elements < 2) {
        return absl::InternalError(Cat("redis ", who, ": CLUSTER SLOTS: a malformed range"));
      }
      const redisReply& master = *range.element[2];
      Endpoint ep;
      ep.host = std::string(ReplyText(*master.element[0]));
      ep.port = static_cast<uint16_t>(master.element[1]->integer);
      if (ep.host.empty()) ep.host = who.substr(0, who.rfind(':'));  // "" means the node asked
      const int index = IndexOf(NodeFor(ep, /*master=*/true));
      for (long long s = range.element[0]->integer; s <= range.element[1]->integer; ++s) {
        if (s >= 0 && s < kSlots) owner[s] = index;
      }
    }
    if (owner != slot_owner_) {
      int masters = 0;
      for (size_t i = 0; i < nodes_.size(); ++i) {
        masters += std::find(owner.begin(), owner.end(), static_cast<int>(i)) != owner.end();
      }
      Log(false, Cat("event=redis_cluster_slots masters=", masters, " from=", who));
    }
    slot_owner_ = owner;
    // Nodes that own no slot any more (a failed master) are not masters.
    for (size_t i = 0; i < nodes_.size(); ++i) {
      bool owns = false;
      for (int s = 0; s < kSlots && !owns; ++s) owns = owner[s] == static_cast<int>(i);
      nodes_[i]->master = owns;
    }
    CountMasters();
    UpdateCoverage();
    return absl::OkStatus();
  }

  void UpdateCoverage() {
    bool covered = true;
    if (!options_.cluster) {
      covered = !nodes_.empty() && nodes_[0]->state == Node::kReady;
    } else {
      for (int s = 0; s < kSlots && covered; ++s) {
        const int i = slot_owner_[s];
        covered = i >= 0 && nodes_[i]->state == Node::kReady;
      }
    }
    covered_.store(covered, std::memory_order_relaxed);
  }

  // -- Timeouts ------------------------------------------------------------------

  void StartSweep() {
    const auto tick = std::clamp(timeout_ / 5, std::chrono::microseconds(1000),
                                 std::chrono::microseconds(10'000));
    sweep_.expires_after(tick);
    sweep_.async_wait([this](boost::system::error_code ec) {
      if (ec || stopping_now_) return;
      Sweep();
      StartSweep();
    });
  }

  void Sweep() {
    const auto now = SteadyClock::now();
    for (auto& node : nodes_) {
      Node& n = *node;
      // Every entry on its own deadline: a CLUSTER SLOTS waits up to the
      // connect timeout and a call resent after NOSCRIPT, MOVED or ASK keeps
      // its first deadline, so the queue is not in deadline order. A whole
      // pass costs a compare per call waiting, a few times per timeout.
      for (Entry& e : n.pending) {
        if (e.deadline > now) continue;
        if (e.kind == Entry::kUser && e.req->done) {
          Fail(*e.req, absl::DeadlineExceededError(Cat("redis ", n.endpoint.ToString(),
                                                       ": no answer within ",
                                                       options_.timeout.micros() / 1000, " ms")));
        } else if (e.kind == Entry::kInternal && e.internal) {
          std::function<void(absl::StatusOr<Reply>)> internal = std::move(e.internal);
          e.internal = nullptr;
          internal(absl::DeadlineExceededError(Cat("redis ", n.endpoint.ToString(), ": ", e.what,
                                                   ": no answer within the connect timeout")));
        }
      }
      // Silence, not a count of timeouts, drops a connection: pipelined
      // calls all time out together in one stall, and a short stall is no
      // reason to reconnect. A node silent for `max_timeouts` timeouts
      // while a call waits is hung (or the network drops packets).
      if (n.state == Node::kReady && !n.pending.empty()) {
        const auto silent = now - std::max(n.last_answer, n.pending.front().sent);
        if (silent >= timeout_ * options_.max_timeouts) {
          Close(n,
                absl::DeadlineExceededError(Cat(
                    "redis ", n.endpoint.ToString(), ": no answer for ",
                    std::chrono::duration_cast<std::chrono::milliseconds>(silent).count(), " ms")));
        }
      }
    }
    if (!options_.sentinel_master.empty() && nodes_[0]->state == Node::kReady &&
        now - last_sentinel_check_ >= std::chrono::seconds(1)) {
      last_sentinel_check_ = now;
      CheckSentinels();
    }
    // A Cluster with slots that have no reachable master: look for the new
    // masters (a replica promoted after a failover).
    if (options_.cluster && !covered_.load(std::memory_order_relaxed) &&
        now - last_refresh_ > std::chrono::milliseconds(250)) {
      RefreshSoon();
    }
  }

  ClientOptions options_;
  // Set when options_.tls.enabled; replaced by ReloadTls (I/O thread only).
  std::shared_ptr<net::ssl::context> tls_context_;
  const bool uses_tls_;  // fixed at Connect
  mutable std::mutex server_mu_;
  std::string server_;  // Health().server
  std::chrono::microseconds timeout_;
  net::io_context ioc_{1};
  std::thread thread_;
  net::steady_timer sweep_;
  std::vector<std::shared_ptr<Deferred>> deferred_;  // I/O thread only

  std::mutex inbox_mu_;
  std::vector<std::unique_ptr<Request>> inbox_;
  bool flush_posted_ = false;
  bool flushing_now_ = false;  // Send is writing at once (the client's thread only)
  bool stopping_ = false;
  bool stopping_now_ = false;                 // I/O thread only
  std::vector<std::unique_ptr<Node>> nodes_;  // I/O thread only; never shrinks
  std::array<int, kSlots> slot_owner_;        // index into nodes_, -1: unknown
  bool refresh_in_flight_ = false;
  SteadyClock::time_point last_refresh_{};
  SteadyClock::time_point last_sentinel_check_{};

  std::atomic<int> masters_{0};
  std::atomic<int> masters_up_{0};
  std::atomic<bool> covered_{false};
  std::atomic<uint64_t> requests_{0};
  std::atomic<int64_t> round_trip_us_{0};  // RoundTrip()
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> timeouts_{0};
  std::atomic<uint64_t> late_replies_{0};
  std::atomic<uint64_t> reconnects_{0};
  std::atomic<uint64_t> redirects_{0};
  std::atomic<uint64_t> refreshes_{0};
};

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  if (options.nodes.empty()) return absl::InvalidArgumentError("redis: no node given");
  if (options.cluster && options.database != 0) {
    return absl::InvalidArgumentError("redis cluster: a Cluster has only database 0");
  }
  if (options.cluster && !options.sentinel_master.empty()) {
    return absl::InvalidArgumentError("redis: a Cluster or sentinels, not both");
  }
  std::shared_ptr<net::ssl::context> tls;
  if (options.tls.enabled) {
    absl::StatusOr<std::shared_ptr<net::ssl::context>> made = MakeTlsContext(options.tls);
    if (!made.ok()) return made.status();
    tls = *std::move(made);
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(tls));
  absl::Status started = impl->Start();
  if (!started.ok()) {
    impl->Stop();
    return started;
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { impl_->Stop(); }
void Client::Stop() { impl_->Stop(); }
void Client::Send(uint16_t slot, std::string command, ReplyCallback done, ReplyCallback late,
                  std::chrono::steady_clock::time_point deadline) {
  impl_->Send(slot, std::move(command), std::move(done), std::move(late), deadline);
}
void Client::After(std::chrono::nanoseconds delay, std::function<void()> fn) {
  impl_->After(delay, std::move(fn));
}
ClientHealth Client::Health() const { return impl_->Health(); }
absl::Status Client::ReloadTls(const TlsOptions& tls) { return impl_->ReloadTls(tls); }
const ClientOptions& Client::options() const { return impl_->options(); }
std::chrono::microseconds Client::RoundTrip() const { return impl_->RoundTrip(); }
bool Client::OnIoThread() const { return impl_->OnIoThread(); }

}  // namespace sluice::redis
