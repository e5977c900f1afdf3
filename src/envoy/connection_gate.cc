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
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "base/cat.h"
#include "spdlog/spdlog.h"

namespace sluice::envoy {
namespace {

using internal::Cat;

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
                      "gauge", [open = open_] { return open->load(std::memory_order_relaxed); });
    hand_off_ = std::move(hand_off);
    thread_ = std::thread([this] { Run(); });
  }

  // Closes the listener (new connections are refused by the kernel) and the
  // connections not handed off yet; those handed off are gRPC's to close.
  // Returns when the thread has ended.
  void Stop() override {
    if (thread_.joinable()) {
      const uint64_t one = 1;
      (void)!write(wake_, &one, sizeof(one));
      thread_.join();
    }
    for (const auto& [fd, seq] : pending_) close(fd);
    pending_.clear();
    waiting_.clear();
    if (listener_ >= 0) close(listener_);
    listener_ = -1;
    Publish();
  }

  uint16_t port() const override { return port_; }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kLookEvery = std::chrono::seconds(1);
  static constexpr auto kLookWhenFullEvery = std::chrono::milliseconds(100);
  static constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
  static constexpr auto kAcceptLogInterval = std::chrono::seconds(10);
  static constexpr int kAcceptBatch = 64;  // per wake-up, so the rest of the loop keeps its turn

  struct Waiting {  // a connection waiting for its first bytes
    Clock::time_point deadline;
    int fd;
    uint64_t seq;  // tells a reused descriptor from the one this entry was for
  };

  GateImpl(Options options, metrics::Metrics& metrics)
      : options_(options),
        open_(std::make_shared<std::atomic<int64_t>>(0)),
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
  }

  bool Watch(int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    return epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) == 0;
  }

  int64_t Open() const { return static_cast<int64_t>(pending_.size() + handed_.size()); }
  void Publish() { open_->store(Open(), std::memory_order_relaxed); }

  void Run() {
    std::array<epoll_event, 64> events;
    for (;;) {
      const int n =
          epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), WaitMs(Clock::now()));
      if (n < 0 && errno != EINTR) {
        spdlog::error("event=grpc_gate_error error=\"{}\" note=\"no more gRPC connections\"",
                      strerror(errno));
        return;
      }
      for (int i = 0; i < n; ++i) {
        const int fd = events[static_cast<size_t>(i)].data.fd;
        if (fd == wake_) return;
        if (fd == listener_) {
          Accept();
        } else {
          Ready(fd, events[static_cast<size_t>(i)].events);
        }
      }
      const Clock::time_point now = Clock::now();
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

  int WaitMs(Clock::time_point now) const {
    Clock::time_point until = next_look_;
    if (!waiting_.empty()) until = std::min(until, waiting_.front().deadline);
    if (paused_) until = std::min(until, resume_at_);
    if (until <= now) return 0;
    // Rounded up: waking early would find nothing due and spin.
    return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(until - now).count());
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
      const Clock::time_point now = Clock::now();
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
      pending_[fd] = seq;
      waiting_.push_back(
          {now + std::chrono::microseconds(options_.handshake_timeout.micros()), fd, seq});
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
    const Clock::time_point now = Clock::now();
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
    epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    pending_.erase(fd);
    struct stat st {};
    if ((events & (EPOLLERR | EPOLLHUP)) != 0 || fstat(fd, &st) != 0) {
      close(fd);
    } else {
      // gRPC sets this on the connections it accepts itself: without it,
      // a small answer can wait for the client's delayed ACK.
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      handed_[fd] = st.st_ino;
      hand_off_(fd);
    }
    Publish();
  }

  // The counters and the gauge change before the connections close: a
  // client that sees its connection closed then reads metrics that count it.
  void Expire(Clock::time_point now) {
    std::vector<int> expired;
    while (!waiting_.empty() && waiting_.front().deadline <= now) {
      const Waiting w = waiting_.front();
      waiting_.pop_front();
      auto it = pending_.find(w.fd);
      if (it == pending_.end() || it->second != w.seq) continue;  // handed off or gone
      pending_.erase(it);
      epoll_ctl(epoll_, EPOLL_CTL_DEL, w.fd, nullptr);
      handshake_timeouts_->Add();
      expired.push_back(w.fd);
    }
    if (expired.empty()) return;
    Publish();
    for (int fd : expired) close(fd);
  }

  // Forgets the connections gRPC has closed.
  void Look(Clock::time_point now) {
    absl::erase_if(handed_, [](const std::pair<const int, ino_t>& entry) {
      struct stat st {};
      return fstat(entry.first, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != entry.second;
    });
    next_look_ = now + kLookEvery;
    Publish();
  }

  const Options options_;
  std::shared_ptr<std::atomic<int64_t>> open_;  // shared with the gauge, which may outlive the gate
  metrics::Counter* refused_;
  metrics::Counter* handshake_timeouts_;
  metrics::Metrics& metrics_;
  int listener_ = -1;
  int epoll_ = -1;
  int wake_ = -1;
  uint16_t port_ = 0;
  std::function<void(int)> hand_off_;
  std::thread thread_;
  // The thread's own:
  absl::flat_hash_map<int, uint64_t> pending_;  // waiting for first bytes: fd -> seq
  std::deque<Waiting> waiting_;                 // by deadline (handshake_timeout is one for all)
  absl::flat_hash_map<int, ino_t> handed_;      // handed to gRPC: fd -> its socket's inode
  uint64_t seq_ = 0;
  Clock::time_point next_look_ = Clock::now() + kLookEvery;
  Clock::time_point next_look_when_full_{};
  bool paused_ = false;
  Clock::time_point resume_at_{};
  Clock::time_point next_accept_log_{};
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
