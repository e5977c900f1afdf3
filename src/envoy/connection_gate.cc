#include "envoy/connection_gate.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "base/cat.h"
#include "spdlog/spdlog.h"
#include "tls/wire.h"

namespace sluice::envoy {
namespace {

using internal::Cat;
using Steady = std::chrono::steady_clock;

// What a thread of the gate is told: the stronger of `what` and what it
// was told before is kept in `told`; `wake` (an eventfd) wakes it.
void Tell(std::atomic<uint64_t>& told, uint64_t what, int wake) {
  uint64_t now = told.load();
  while (now < what && !told.compare_exchange_weak(now, what)) {
  }
  const uint64_t one = 1;
  (void)!write(wake, &one, sizeof(one));
}
constexpr uint64_t kClose = 1;  // the listener closed
constexpr uint64_t kStop = 2;   // the end

// epoll_wait's timeout to `until`, rounded up: waking early would find
// nothing due and spin.
int WaitMs(Steady::time_point until, Steady::time_point now) {
  if (until <= now) return 0;
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(until - now).count());
}

// One thread of TLS connections (Options::relay_threads of them): each
// connection's handshake, then the relay between it and gRPC's end of a
// socket pair. What one side sends passes through the loop's one buffer
// (`scratch_`, one TLS record's plaintext) to the other; only what the
// other does not take at once is kept, per connection, and while it is,
// nothing more is read from the side that sent it.
class RelayLoop {
 public:
  // The gate's, which outlives its loops.
  struct Shared {
    const std::function<void(int)>* hand_off;  // takes gRPC's end of a pair
    metrics::Counter* handshake_failed;
    metrics::Counter* handshake_expired;
    std::atomic<int64_t>* relayed;  // connections the loops hold, counted for the gate's cap
  };

  // Null when the system gives no descriptor for its epoll or its wake-up
  // (errno says why).
  static std::unique_ptr<RelayLoop> Make(Shared shared) {
    auto loop = std::unique_ptr<RelayLoop>(new RelayLoop(shared));
    loop->epoll_ = epoll_create1(EPOLL_CLOEXEC);
    loop->wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (loop->epoll_ < 0 || loop->wake_ < 0) return nullptr;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = loop->wake_;
    if (epoll_ctl(loop->epoll_, EPOLL_CTL_ADD, loop->wake_, &ev) != 0) return nullptr;
    return loop;
  }

  ~RelayLoop() {
    Stop();
    for (int fd : {epoll_, wake_}) {
      if (fd >= 0) close(fd);
    }
  }

  void Start() {
    thread_ = std::thread([this] { Run(); });
    // Its name in `top -H` and /proc/<pid>/task/*/comm (15 characters at most).
    pthread_setname_np(thread_.native_handle(), "sluice-grpc-tls");
  }

  // Takes `fd`, a client's connection that sent its first bytes (counted in
  // Shared::relayed by the caller), for a handshake with `context` that
  // must be done by `deadline`. From any thread.
  void Adopt(int fd, uint64_t seq, Steady::time_point deadline,
             std::shared_ptr<tls::Context> context) {
    {
      std::lock_guard lock(mu_);
      inbox_.push_back({fd, seq, deadline, std::move(context)});
    }
    const uint64_t one = 1;
    (void)!write(wake_, &one, sizeof(one));
  }

  // Ends the connections whose handshake is not done (the listener closed).
  void Close() { Tell(told_, kClose, wake_); }

  // Ends every connection, then the thread; returns when it has ended.
  void Stop() {
    Tell(told_, kStop, wake_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  static constexpr size_t kRelayBuffer = 16 * 1024;
  static constexpr uint32_t kUnwatched = ~0u;  // a descriptor taken out of epoll

  struct Adopted {
    int fd;
    uint64_t seq;  // tells a reused descriptor from the one a deadline was for
    Steady::time_point deadline;
    std::shared_ptr<tls::Context> context;
  };
  struct Deadline {
    Steady::time_point at;
    int fd;
    uint64_t seq;
    bool operator>(const Deadline& other) const { return at > other.at; }
  };

  struct Relay {
    ~Relay() {
      if (ssl != nullptr) SSL_free(ssl);
    }
    int client = -1;  // the client's connection (epoll knows it by this)
    int inner = -1;   // the loop's end of the pair, once handed off
    uint64_t seq = 0;
    tls::Wire wire;
    SSL* ssl = nullptr;
    bool handshaken = false;
    bool client_done = false;  // no more from the client (close_notify or EOF)
    bool inner_shut = false;   // gRPC told so (the pair shut for writing)
    bool grpc_done = false;    // no more from gRPC (it closed its end)
    bool wants_write = false;  // OpenSSL waits for the client's socket to take more
    size_t writing = 0;        // bytes of `out` an SSL_write_ex waiting to be retried took
    std::string in;            // decrypted, not yet taken by gRPC
    std::string out;           // from gRPC, not yet encrypted
    uint32_t client_events = 0, inner_events = 0;  // what epoll watches for each
  };

  explicit RelayLoop(Shared shared) : shared_(shared) {}

  void Run() {
    std::array<epoll_event, 64> events;
    for (;;) {
      const int n =
          epoll_wait(epoll_, events.data(), static_cast<int>(events.size()),
                     deadlines_.empty() ? -1 : WaitMs(deadlines_.top().at, Steady::now()));
      if (n < 0 && errno != EINTR) {
        spdlog::error("event=grpc_gate_error error=\"{}\" note=\"no more gRPC TLS connections\"",
                      strerror(errno));
        return;
      }
      bool woken = false;
      for (int i = 0; i < n; ++i) {
        const int fd = events[static_cast<size_t>(i)].data.fd;
        if (fd == wake_) {
          uint64_t ignored;
          (void)!read(wake_, &ignored, sizeof(ignored));
          woken = true;
        } else if (auto relay = relays_.find(fd); relay != relays_.end()) {
          const std::shared_ptr<Relay> r = relay->second;  // alive while it ends
          Advance(*r, fd, events[static_cast<size_t>(i)].events);
        }
      }
      // After the batch: an adopted descriptor may have the number of one
      // closed in it, whose events the batch may still hold.
      if (woken) {
        TakeInbox();
        const uint64_t told = told_.load();
        if (told == kStop) {
          EndRelays([](const Relay&) { return true; });
          return;
        }
        if (told == kClose) EndRelays([](const Relay& relay) { return !relay.handshaken; });
      }
      Expire(Steady::now());
    }
  }

  void TakeInbox() {
    std::vector<Adopted> taken;
    {
      std::lock_guard lock(mu_);
      taken.swap(inbox_);
    }
    for (Adopted& a : taken) {
      deadlines_.push({a.deadline, a.fd, a.seq});
      StartTls(a);
    }
  }

  // Ends the relays `which` picks.
  template <typename Which>
  void EndRelays(Which which) {
    std::vector<std::shared_ptr<Relay>> ending;
    for (const auto& [fd, relay] : relays_) {
      if (fd == relay->client && which(*relay)) ending.push_back(relay);
    }
    for (const auto& relay : ending) End(*relay, false);
  }

  // The handshake begins, to be done by its deadline.
  void StartTls(const Adopted& a) {
    auto relay = std::make_shared<Relay>();
    Relay& r = *relay;
    r.client = a.fd;
    r.seq = a.seq;
    r.client_events = EPOLLIN | EPOLLRDHUP;
    r.wire.fd = a.fd;
    relays_[a.fd] = std::move(relay);
    epoll_event ev{};
    ev.events = r.client_events;
    ev.data.fd = a.fd;
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, a.fd, &ev) != 0) {
      r.client_events = kUnwatched;
      End(r, false);
      return;
    }
    r.ssl = SSL_new(a.context->native_handle());
    BIO* bio = r.ssl != nullptr ? tls::NewWireBio(&r.wire) : nullptr;
    if (bio == nullptr) {  // out of memory
      End(r, false);
      return;
    }
    SSL_set_bio(r.ssl, bio, bio);
    SSL_set_accept_state(r.ssl);
    // Partial writes: a record at a time; moving buffer: an SSL_write_ex
    // retried from `out` after it was offered from `scratch_`; released
    // buffers: an idle connection holds no record buffer.
    SSL_set_mode(r.ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
    Advance(r, a.fd, EPOLLIN);
  }

  // `events` came for `fd` of `r`: moves what can be moved, either way,
  // until nothing more can be without a readiness event; then watches for
  // the ones that would let it go on, or ends the relay.
  void Advance(Relay& r, int fd, uint32_t events) {
    if (fd == r.client && (events & (EPOLLHUP | EPOLLERR)) != 0) {
      // Reset, or closed both ways: nothing more reaches the client.
      if (!r.handshaken) shared_.handshake_failed->Add();
      End(r, false);
      return;
    }
    if (!r.handshaken) {
      ERR_clear_error();
      if (SSL_do_handshake(r.ssl) != 1) {
        const int error = SSL_get_error(r.ssl, 0);
        ERR_clear_error();
        if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
          Rewatch(r.client, r.client_events,
                  error == SSL_ERROR_WANT_WRITE ? EPOLLOUT : EPOLLIN | EPOLLRDHUP);
          return;
        }
        shared_.handshake_failed->Add();  // OpenSSL has sent its alert, if it could
        End(r, false);
        return;
      }
      if (!HandOff(r)) return;
    }
    bool failed = false;
    for (bool moved = true; moved && !failed;) {
      moved = false;
      r.wants_write = false;
      // The client's, decrypted, to gRPC: what gRPC does not take at once
      // waits in `in`, and nothing more is read until it has taken it.
      if (!r.in.empty()) {
        const size_t sent = Send(r.inner, r.in.data(), r.in.size(), failed);
        r.in.erase(0, sent);
        if (r.in.empty()) Release(r.in);
        moved = sent > 0;
      }
      if (!r.client_done && r.in.empty() && !failed) {
        size_t n = 0;
        ERR_clear_error();
        if (SSL_read_ex(r.ssl, scratch_.data(), scratch_.size(), &n) == 1) {
          const size_t sent = Send(r.inner, scratch_.data(), n, failed);
          r.in.assign(scratch_.data() + sent, n - sent);
          moved = true;
        } else {
          const int error = SSL_get_error(r.ssl, 0);
          ERR_clear_error();
          if (error == SSL_ERROR_WANT_WRITE) {
            r.wants_write = true;
          } else if (error == SSL_ERROR_ZERO_RETURN) {
            r.client_done = true;  // close_notify, or its close (the context ignores a bare EOF)
          } else if (error != SSL_ERROR_WANT_READ) {
            failed = true;
          }
        }
      }
      if (r.client_done && r.in.empty() && !r.inner_shut) {
        shutdown(r.inner, SHUT_WR);  // gRPC reads the end of the stream
        r.inner_shut = true;
      }
      // gRPC's, encrypted, to the client: what the client's socket does not
      // take waits in `out`, likewise (and an SSL_write_ex that must be
      // retried is retried with the same bytes).
      if (!r.out.empty() && !failed) {
        const size_t written =
            Write(r, r.out.data(), r.writing > 0 ? r.writing : r.out.size(), failed);
        r.out.erase(0, written);
        if (r.out.empty()) Release(r.out);
        moved = moved || written > 0;
      }
      if (!r.grpc_done && r.out.empty() && !failed) {
        const ssize_t n = recv(r.inner, scratch_.data(), scratch_.size(), 0);
        if (n > 0) {
          const size_t length = static_cast<size_t>(n);
          const size_t written = Write(r, scratch_.data(), length, failed);
          r.out.assign(scratch_.data() + written, length - written);
          moved = true;
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          r.grpc_done = true;
        }
      }
    }
    if (failed || (r.grpc_done && r.out.empty()) || (r.client_done && r.grpc_done)) {
      // gRPC closed (idle, too old, shut down): close_notify to the client,
      // once, without waiting for the client's.
      End(r, !failed && r.grpc_done && r.out.empty());
      return;
    }
    uint32_t client = r.wants_write ? EPOLLOUT : 0;
    if (!r.client_done && r.in.empty()) client |= EPOLLIN | EPOLLRDHUP;
    Rewatch(r.client, r.client_events, client);
    if (r.grpc_done) {
      // Its end closed, the pair would report a hang-up at every wait:
      // nothing more goes to gRPC, what it sent is still written out.
      if (r.inner_events != kUnwatched) epoll_ctl(epoll_, EPOLL_CTL_DEL, r.inner, nullptr);
      r.inner_events = kUnwatched;
      Release(r.in);
      return;
    }
    uint32_t inner = r.in.empty() ? 0 : EPOLLOUT;
    if (r.out.empty()) inner |= EPOLLIN | EPOLLRDHUP;
    Rewatch(r.inner, r.inner_events, inner);
  }

  // Sends what the pair takes of `data` to gRPC, without waiting; sets
  // `failed` when gRPC closed its end.
  static size_t Send(int fd, const char* data, size_t size, bool& failed) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) failed = true;
    return n > 0 ? static_cast<size_t>(n) : 0;
  }

  // Encrypts what the client's socket takes of `data`, without waiting:
  // the bytes written (whole records), or 0 with `r.writing` set when the
  // same `size` bytes must be offered again; sets `failed` when TLS fails.
  static size_t Write(Relay& r, const char* data, size_t size, bool& failed) {
    size_t n = 0;
    ERR_clear_error();
    if (SSL_write_ex(r.ssl, data, size, &n) == 1) {
      r.writing = 0;
      return n;
    }
    const int error = SSL_get_error(r.ssl, 0);
    ERR_clear_error();
    if (error == SSL_ERROR_WANT_WRITE || error == SSL_ERROR_WANT_READ) {
      r.writing = size;
      r.wants_write = error == SSL_ERROR_WANT_WRITE;
    } else {
      failed = true;
    }
    return 0;
  }

  // Gives a drained buffer's memory back: an idle connection holds none.
  static void Release(std::string& buffer) { std::string().swap(buffer); }

  // The handshake is done: gRPC gets one end of a socket pair, the relay
  // the other. False when the relay ended (no descriptor to be had).
  bool HandOff(Relay& r) {
    r.handshaken = true;
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
      spdlog::error("event=grpc_tls_error error=\"socketpair: {}\"", strerror(errno));
      End(r, false);
      return false;
    }
    r.inner = pair[0];
    epoll_event ev{};
    ev.events = r.inner_events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = r.inner;
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, r.inner, &ev) != 0) {
      close(pair[1]);
      End(r, false);
      return false;
    }
    std::shared_ptr<Relay> same = relays_[r.client];
    relays_[r.inner] = std::move(same);  // the same relay, by either descriptor
    (*shared_.hand_off)(pair[1]);
    return true;
  }

  // Watches `fd` for `events` (`now`: what it is watched for).
  void Rewatch(int fd, uint32_t& now, uint32_t events) {
    if (events == now || now == kUnwatched) return;
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_, EPOLL_CTL_MOD, fd, &ev) == 0) now = events;
  }

  // Closes both ends of `r` (with `notify`, a close_notify to the client
  // first) and forgets it.
  void End(Relay& r, bool notify) {
    if (notify) {
      ERR_clear_error();
      (void)SSL_shutdown(r.ssl);
      ERR_clear_error();
    }
    // The gauge first: a client that sees its connection closed then
    // reads a gauge without it.
    shared_.relayed->fetch_sub(1, std::memory_order_relaxed);
    const int client = r.client, inner = r.inner;
    for (int fd : {client, inner}) {
      if (fd < 0) continue;
      epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
      close(fd);
    }
    const std::shared_ptr<Relay> keep = relays_[client];  // r lives until both entries are gone
    relays_.erase(client);
    if (inner >= 0) relays_.erase(inner);
  }

  // Ends the handshakes not done by their deadline.
  void Expire(Steady::time_point now) {
    while (!deadlines_.empty() && deadlines_.top().at <= now) {
      const Deadline d = deadlines_.top();
      deadlines_.pop();
      auto relay = relays_.find(d.fd);
      if (relay == relays_.end()) continue;
      const std::shared_ptr<Relay> r = relay->second;
      if (r->client == d.fd && r->seq == d.seq && !r->handshaken) {
        shared_.handshake_expired->Add();
        End(*r, false);
      }
    }
  }

  const Shared shared_;
  int epoll_ = -1;
  int wake_ = -1;
  std::thread thread_;
  std::atomic<uint64_t> told_{0};
  std::mutex mu_;
  std::vector<Adopted> inbox_;  // guarded by mu_
  // The thread's own:
  // TLS connections by either descriptor (the client's, the pair's end).
  absl::flat_hash_map<int, std::shared_ptr<Relay>> relays_;
  std::priority_queue<Deadline, std::vector<Deadline>, std::greater<>> deadlines_;  // handshakes'
  std::array<char, kRelayBuffer> scratch_;  // what is relayed passes through
};

class GateImpl final : public ConnectionGate {
 public:
  // Listens on `where` (its first address, as the HTTP listeners do);
  // nothing is accepted before Start.
  static absl::StatusOr<std::unique_ptr<GateImpl>> Listen(const HostPort& where, Options options,
                                                          metrics::Metrics& metrics) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(where.port);
    if (const int e = getaddrinfo(where.host.c_str(), port.c_str(), &hints, &found); e != 0) {
      return absl::InvalidArgumentError(
          Cat("cannot resolve ", where.host, " (grpc.listen): ", gai_strerror(e)));
    }
    const addrinfo first = *found;
    auto gate = std::unique_ptr<GateImpl>(new GateImpl(options, metrics));
    gate->listener_ = socket(first.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int e = gate->listener_ < 0 ? errno : 0;
    const int one = 1;
    // No SO_REUSEPORT: a second process must fail to start, not share the port.
    if (e == 0 && setsockopt(gate->listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
      e = errno;
    }
    if (e == 0 && bind(gate->listener_, first.ai_addr, first.ai_addrlen) != 0) e = errno;
    freeaddrinfo(found);
    if (e == 0 && listen(gate->listener_, SOMAXCONN) != 0) e = errno;
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (e == 0 && getsockname(gate->listener_, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      e = errno;
    }
    gate->epoll_ = epoll_create1(EPOLL_CLOEXEC);
    gate->wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e == 0 && (gate->epoll_ < 0 || gate->wake_ < 0)) e = errno;
    if (e == 0 && (!gate->Watch(gate->listener_, EPOLLIN) || !gate->Watch(gate->wake_, EPOLLIN))) {
      e = errno;
    }
    if (e == 0 && options.tls != nullptr) {
      const RelayLoop::Shared shared = {.hand_off = &gate->hand_off_,
                                        .handshake_failed = gate->handshake_failed_,
                                        .handshake_expired = gate->handshake_expired_,
                                        .relayed = &gate->counts_->relayed};
      for (int i = 0; i < std::max(1, options.relay_threads) && e == 0; ++i) {
        std::unique_ptr<RelayLoop> loop = RelayLoop::Make(shared);
        if (loop == nullptr) e = errno;
        gate->loops_.push_back(std::move(loop));
      }
    }
    if (e != 0) {
      return absl::UnavailableError(
          Cat("cannot listen on ", where.host, ":", where.port, " (grpc.listen): ", strerror(e)));
    }
    gate->port_ =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    return gate;
  }

  ~GateImpl() override {
    Stop();
    for (int fd : {epoll_, wake_}) {
      if (fd >= 0) close(fd);
    }
  }

  // Accepts on a thread of its own; `hand_off` takes each connection that
  // sent its first bytes, and with it the descriptor.
  void Start(std::function<void(int fd)> hand_off) override {
    metrics_.AddGauge("sluice_grpc_connections",
                      "Open connections to grpc.listen, those waiting for their first bytes "
                      "included.",
                      "gauge", [counts = counts_] {
                        return counts->gate.load(std::memory_order_relaxed) +
                               counts->relayed.load(std::memory_order_relaxed);
                      });
    hand_off_ = std::move(hand_off);
    for (const auto& loop : loops_) loop->Start();
    thread_ = std::thread([this] { Run(); });
  }

  void SetTls(std::shared_ptr<tls::Context> context) override {
    if (context != nullptr && options_.tls != nullptr) tls_.store(std::move(context));
  }

  void Close() override { Tell(told_, kClose, wake_); }

  void Stop() override {
    Tell(told_, kStop, wake_);
    if (thread_.joinable()) thread_.join();
    CloseListener();
    for (const auto& loop : loops_) loop->Stop();  // each ends its relays
  }

  uint16_t port() const override { return port_; }

 private:
  static constexpr auto kLookEvery = std::chrono::seconds(1);
  static constexpr auto kLookWhenFullEvery = std::chrono::milliseconds(100);
  static constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
  static constexpr auto kAcceptLogInterval = std::chrono::seconds(10);
  static constexpr int kAcceptBatch = 64;  // per wake-up, so the rest of the loop keeps its turn

  struct Waiting {  // a connection waiting for its first bytes
    Steady::time_point deadline;
    int fd;
    uint64_t seq;  // tells a reused descriptor from the one this entry was for
  };
  struct Pending {
    uint64_t seq;
    Steady::time_point deadline;
  };

  // The open connections, for the gauge (which may outlive the gate) and
  // the cap: the gate's (waiting, handed to gRPC) and the loops'.
  struct Counts {
    std::atomic<int64_t> gate{0};
    std::atomic<int64_t> relayed{0};
  };

  GateImpl(Options options, metrics::Metrics& metrics)
      : options_(options),
        counts_(std::make_shared<Counts>()),
        tls_(options.tls),
        refused_(metrics.Get("sluice_grpc_connections_refused_total", {})),
        handshake_timeouts_(metrics.Get("sluice_grpc_handshake_timeouts_total", {})),
        metrics_(metrics) {
    for (const char* reason : {"fd_limit", "memory"}) {  // at 0 from the start
      metrics.Get("sluice_accept_errors_total", {{"listener", "grpc"}, {"reason", reason}});
    }
    metrics.SetHelp("sluice_grpc_connections_refused_total",
                    "Connections to grpc.listen closed at once: grpc.max_connections were open.");
    metrics.SetHelp("sluice_grpc_handshake_timeouts_total",
                    "Connections to grpc.listen closed for sending nothing within "
                    "grpc.handshake_timeout.");
    if (options.tls != nullptr) {
      handshake_failed_ = metrics.Get("sluice_tls_handshake_failures_total",
                                      {{"listener", "grpc"}, {"reason", "failed"}});
      handshake_expired_ = metrics.Get("sluice_tls_handshake_failures_total",
                                       {{"listener", "grpc"}, {"reason", "timeout"}});
    }
  }

  // The listener and the connections not handed off yet (a TLS handshake
  // not done included).
  void CloseListener() {
    for (const auto& [fd, pending] : pending_) close(fd);
    pending_.clear();
    waiting_.clear();
    for (const auto& loop : loops_) loop->Close();
    if (listener_ >= 0) close(listener_);
    listener_ = -1;
    Publish();
  }

  bool Watch(int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    return epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) == 0;
  }

  int64_t Open() const {
    return static_cast<int64_t>(pending_.size() + handed_.size()) +
           counts_->relayed.load(std::memory_order_relaxed);
  }
  void Publish() {
    counts_->gate.store(static_cast<int64_t>(pending_.size() + handed_.size()),
                        std::memory_order_relaxed);
  }

  void Run() {
    std::array<epoll_event, 64> events;
    for (;;) {
      const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()),
                               WaitMs(Due(), Steady::now()));
      if (n < 0 && errno != EINTR) {
        spdlog::error("event=grpc_gate_error error=\"{}\" note=\"no more gRPC connections\"",
                      strerror(errno));
        return;
      }
      for (int i = 0; i < n; ++i) {
        const int fd = events[static_cast<size_t>(i)].data.fd;
        if (fd == wake_) {
          uint64_t ignored;
          (void)!read(wake_, &ignored, sizeof(ignored));
          if (told_.load() == kStop) return;
          if (listener_ >= 0) CloseListener();
        } else if (fd == listener_) {
          Accept();
        } else {
          Ready(fd, events[static_cast<size_t>(i)].events);
        }
      }
      const Steady::time_point now = Steady::now();
      Expire(now);
      if (now >= next_look_) Look(now);
      if (paused_ && now >= resume_at_) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.fd = listener_;
        if (epoll_ctl(epoll_, EPOLL_CTL_MOD, listener_, &ev) == 0) paused_ = false;
        resume_at_ = now + kAcceptBackoff;  // if it failed, try again then
      }
    }
  }

  Steady::time_point Due() const {
    Steady::time_point until = next_look_;
    if (!waiting_.empty()) until = std::min(until, waiting_.front().deadline);
    if (paused_) until = std::min(until, resume_at_);
    return until;
  }

  void Accept() {
    for (int i = 0; i < kAcceptBatch; ++i) {
      const int fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int e = errno;
        if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) Pause(e);
        return;  // EAGAIN: none left; others (ECONNABORTED, ...): the next wake-up retries
      }
      // The kernel hands out only free descriptors: one handed to gRPC
      // under this number is closed.
      handed_.erase(fd);
      const Steady::time_point now = Steady::now();
      if (Open() >= options_.max_connections && now >= next_look_when_full_) {
        Look(now);
        next_look_when_full_ = now + kLookWhenFullEvery;
      }
      if (Open() >= options_.max_connections) {
        refused_->Add();  // counted before the client can see it closed
        close(fd);        // full: refuse at once
        continue;
      }
      if (!Watch(fd, EPOLLIN | EPOLLRDHUP)) {
        close(fd);
        continue;
      }
      const uint64_t seq = ++seq_;
      const Steady::time_point deadline =
          now + std::chrono::microseconds(options_.handshake_timeout.micros());
      pending_[fd] = {seq, deadline};
      waiting_.push_back({deadline, fd, seq});
      Publish();
    }
  }

  // Out of descriptors (or socket memory): accept fails at once for as long
  // as it lasts, and the connection stays queued, so the listener is left
  // out of the wait for a moment rather than spun on.
  void Pause(int e) {
    const bool fds = e == EMFILE || e == ENFILE;
    metrics_
        .Get("sluice_accept_errors_total",
             {{"listener", "grpc"}, {"reason", fds ? "fd_limit" : "memory"}})
        ->Add();
    epoll_event ev{};
    ev.data.fd = listener_;
    if (epoll_ctl(epoll_, EPOLL_CTL_MOD, listener_, &ev) == 0) paused_ = true;
    const Steady::time_point now = Steady::now();
    resume_at_ = now + kAcceptBackoff;
    if (now >= next_accept_log_) {
      next_accept_log_ = now + kAcceptLogInterval;
      spdlog::error(
          "event=accept_error listener=grpc reason={} error=\"{}\" backoff_ms={} "
          "note=\"logged at most once per {} s; see sluice_accept_errors_total\"",
          fds ? "fd_limit" : "memory", strerror(e),
          std::chrono::milliseconds(kAcceptBackoff).count(),
          std::chrono::seconds(kAcceptLogInterval).count());
    }
  }

  // A waiting connection sent something (or hung up).
  void Ready(int fd, uint32_t events) {
    auto it = pending_.find(fd);
    if (it == pending_.end()) return;
    const Pending pending = it->second;
    pending_.erase(it);
    epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    struct stat st {};
    if ((events & (EPOLLERR | EPOLLHUP)) != 0 || fstat(fd, &st) != 0) {
      close(fd);
      Publish();
      return;
    }
    // gRPC sets this on the connections it accepts itself: without it,
    // a small answer can wait for the client's delayed ACK.
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (!loops_.empty()) {
      // Its handshake, by the same deadline, on the next loop in turn.
      counts_->relayed.fetch_add(1,
                                 std::memory_order_relaxed);  // before it leaves pending_'s count
      Publish();
      loops_[next_loop_++ % loops_.size()]->Adopt(fd, pending.seq, pending.deadline, tls_.load());
      return;
    }
    handed_[fd] = st.st_ino;
    hand_off_(fd);
    Publish();
  }

  // The counters and the gauge change before the connections close: a
  // client that sees its connection closed then reads metrics that count it.
  void Expire(Steady::time_point now) {
    std::vector<int> expired;
    while (!waiting_.empty() && waiting_.front().deadline <= now) {
      const Waiting w = waiting_.front();
      waiting_.pop_front();
      auto it = pending_.find(w.fd);
      if (it == pending_.end() || it->second.seq != w.seq) continue;  // handed off or gone
      pending_.erase(it);
      epoll_ctl(epoll_, EPOLL_CTL_DEL, w.fd, nullptr);
      handshake_timeouts_->Add();
      if (handshake_expired_ != nullptr) handshake_expired_->Add();
      expired.push_back(w.fd);
    }
    if (expired.empty()) return;
    Publish();
    for (int fd : expired) close(fd);
  }

  // Forgets the connections gRPC has closed.
  void Look(Steady::time_point now) {
    absl::erase_if(handed_, [](const std::pair<const int, ino_t>& entry) {
      struct stat st {};
      return fstat(entry.first, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != entry.second;
    });
    next_look_ = now + kLookEvery;
    Publish();
  }

  const Options options_;
  std::shared_ptr<Counts> counts_;                  // shared with the gauge
  std::atomic<std::shared_ptr<tls::Context>> tls_;  // of the next handshake
  std::atomic<uint64_t> told_{0};
  metrics::Counter* refused_;
  metrics::Counter* handshake_timeouts_;
  metrics::Counter* handshake_failed_ = nullptr;   // with TLS
  metrics::Counter* handshake_expired_ = nullptr;  // with TLS
  metrics::Metrics& metrics_;
  int listener_ = -1;
  int epoll_ = -1;
  int wake_ = -1;
  uint16_t port_ = 0;
  std::function<void(int)> hand_off_;
  // With TLS: the threads that make the handshakes and relay.
  std::vector<std::unique_ptr<RelayLoop>> loops_;
  std::thread thread_;
  // The thread's own:
  absl::flat_hash_map<int, Pending> pending_;  // waiting for first bytes
  std::deque<Waiting> waiting_;                // by deadline (handshake_timeout is one for all)
  absl::flat_hash_map<int, ino_t> handed_;     // handed to gRPC: fd -> its socket's inode
  size_t next_loop_ = 0;
  uint64_t seq_ = 0;
  Steady::time_point next_look_ = Steady::now() + kLookEvery;
  Steady::time_point next_look_when_full_{};
  bool paused_ = false;
  Steady::time_point resume_at_{};
  Steady::time_point next_accept_log_{};
};

}  // namespace

absl::StatusOr<std::unique_ptr<ConnectionGate>> ConnectionGate::Listen(const HostPort& where,
                                                                       Options options,
                                                                       metrics::Metrics& metrics) {
  absl::StatusOr<std::unique_ptr<GateImpl>> gate = GateImpl::Listen(where, options, metrics);
  if (!gate.ok()) return gate.status();
  return std::unique_ptr<ConnectionGate>(*std::move(gate));
}

}  // namespace sluice::envoy
