// The Envoy rate limit service on gRPC: the generated RateLimitService, its
// one handler, the listener that bounds its connections (Gate), and the
// server around them. All gRPC code of `sluice serve` lives in this file
// (gRPC and protobuf headers are slow to compile).
#include "envoy/rls_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
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
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpc/grpc.h>
#include <grpc/impl/codegen/grpc_types.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_posix.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "base/cat.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "server/headers.h"
#include "spdlog/spdlog.h"

namespace sluice::envoy {

struct RlsServer::Snapshot {
  std::shared_ptr<const RuleSet> rules;
  bool legacy_headers = false;  // server.legacy_headers
};

namespace {

using internal::Cat;
namespace rls = ::envoy::service::ratelimit::v3;
using Code = rls::RateLimitResponse::Code;

// Bounds on one request, far above what Envoy sends (a descriptor per rate
// limit action, an entry per action step), so that a request cannot make
// the service do unbounded work.
constexpr int kMaxDescriptors = 256;
constexpr int kMaxEntries = 64;
constexpr size_t kMaxStateKeyBytes = 64 * 1024;  // longer keys are hashed, see Decide

grpc::StatusCode ToGrpc(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument: return grpc::StatusCode::INVALID_ARGUMENT;
    case absl::StatusCode::kResourceExhausted: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kUnavailable: return grpc::StatusCode::UNAVAILABLE;
    case absl::StatusCode::kDeadlineExceeded: return grpc::StatusCode::DEADLINE_EXCEEDED;
    default: return grpc::StatusCode::INTERNAL;
  }
}

grpc::Status Invalid(std::string message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::move(message));
}

void SetDuration(Duration d, google::protobuf::Duration& out) {
  const int64_t us = std::max<int64_t>(0, d.IsInfinite() ? 0 : d.micros());
  out.set_seconds(us / 1'000'000);
  out.set_nanos(static_cast<int32_t>(us % 1'000'000) * 1000);
}

// gRPC's channel arguments count milliseconds in an int.
static_assert(kMaxTimeout.CeilMillis() <= std::numeric_limits<int>::max());
int Millis(Duration d) {
  return static_cast<int>(std::min<int64_t>(d.CeilMillis(), std::numeric_limits<int>::max()));
}

uint32_t Clamp32(int64_t v) {
  return static_cast<uint32_t>(std::clamp<int64_t>(v, 0, std::numeric_limits<uint32_t>::max()));
}

// One descriptor of a call: what applies to it and what was decided.
struct Item {
  const Rule* rule = nullptr;  // null: no limit
  std::string key;
  int64_t cost = 1;
  std::optional<absl::StatusOr<PolicyDecision>> decision;  // kLimited, once answered
};

class Service;

// One ShouldRateLimit call in flight. Shared by the limiter callbacks; the
// last decision to arrive completes the call, on whatever thread it is.
struct Call {
  Service* service;
  grpc::ServerUnaryReactor* reactor;
  rls::RateLimitResponse* response;
  std::shared_ptr<const RlsServer::Snapshot> snapshot;  // keeps rules and limiters alive
  Time now;
  std::vector<Item> items;
  std::atomic<size_t> pending{1};  // decisions outstanding + the launcher's own hold

  void Done() {
    if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) Complete();
  }
  void Complete();
};

// The call's reactor: counts the call as in flight until gRPC is done with
// it (its status sent), which is what a drain waits for.
class Reactor final : public grpc::ServerUnaryReactor {
 public:
  explicit Reactor(std::atomic<int64_t>& in_flight) : in_flight_(in_flight) {
    in_flight_.fetch_add(1, std::memory_order_acq_rel);
  }
  void OnDone() override {
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    delete this;
  }

 private:
  std::atomic<int64_t>& in_flight_;
};

class Service final : public rls::RateLimitService::CallbackService {
 public:
  Service(const RuleOptions& options, server::Metrics& metrics,
          std::shared_ptr<const RlsServer::Snapshot> snapshot)
      : clock_(*options.clock), overrides_(options), snapshot_(std::move(snapshot)) {
    metrics.SetHelp("sluice_rls_requests_total",
                    "Envoy ShouldRateLimit calls answered, by result.");
    for (auto [i, name] : {std::pair{0, "ok"}, {1, "over_limit"}, {2, "invalid_argument"},
                          {3, "error"}}) {
      results_[i] = metrics.Get("sluice_rls_requests_total", {{"result", name}});
    }
  }

  void Swap(std::shared_ptr<const RlsServer::Snapshot> next) { snapshot_.store(std::move(next)); }
  int64_t in_flight() const { return in_flight_.load(std::memory_order_acquire); }

  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* context,
                                            const rls::RateLimitRequest* request,
                                            rls::RateLimitResponse* response) override {
    (void)context;
    grpc::ServerUnaryReactor* reactor = new Reactor(in_flight_);
    auto call = std::make_shared<Call>();
    call->service = this;
    call->reactor = reactor;
    call->response = response;
    call->snapshot = snapshot_.load();
    if (grpc::Status s = Prepare(*request, *call); !s.ok()) {
      Finish(*call, s);
      return reactor;
    }
    for (Item& item : call->items) {
      if (item.rule == nullptr || item.rule->kind != Rule::Kind::kLimited) continue;
      call->pending.fetch_add(1, std::memory_order_relaxed);
      item.rule->limiter->AcquireAsync(item.key, call->now, item.cost,
                                       [call, &item](absl::StatusOr<PolicyDecision> d) {
                                         item.decision = std::move(d);
                                         call->Done();
                                       });
    }
    call->Done();  // the launcher's hold: with in-process limits the call completes here
    return reactor;
  }

  void Finish(Call& call, const grpc::Status& status) {
    int result = 3;
    if (status.ok()) {
      result = call.response->overall_code() == rls::RateLimitResponse::OVER_LIMIT ? 1 : 0;
    } else if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      result = 2;
    }
    results_[result]->Add();
    call.reactor->Finish(status);
  }

 private:
  // Validates the request and decides what applies to each descriptor.
  grpc::Status Prepare(const rls::RateLimitRequest& request, Call& call) {
    if (request.domain().empty()) return Invalid("domain must not be empty");
    if (request.descriptors().empty()) return Invalid("descriptors must not be empty");
    if (request.descriptors_size() > kMaxDescriptors) {
      return Invalid(Cat("descriptors: ", request.descriptors_size(), " given, the most is ",
                         kMaxDescriptors));
    }
    call.now = clock_.Now();
    const DomainRules* domain = call.snapshot->rules->Find(request.domain());
    const int64_t request_cost = std::max<uint32_t>(1, request.hits_addend());
    std::vector<Entry> entries;
    call.items.resize(static_cast<size_t>(request.descriptors_size()));
    for (int i = 0; i < request.descriptors_size(); ++i) {
      const auto& d = request.descriptors(i);
      Item& item = call.items[static_cast<size_t>(i)];
      if (d.entries().empty()) return Invalid(Cat("descriptors[", i, "]: entries must not be empty"));
      if (d.entries_size() > kMaxEntries) {
        return Invalid(Cat("descriptors[", i, "]: ", d.entries_size(), " entries, the most is ",
                           kMaxEntries));
      }
      entries.clear();
      for (int e = 0; e < d.entries_size(); ++e) {
        if (d.entries(e).key().empty()) {
          return Invalid(Cat("descriptors[", i, "].entries[", e, "]: key must not be empty"));
        }
        entries.push_back({d.entries(e).key(), d.entries(e).value()});
      }
      // Keys over kMaxKeyLength are decided under their SHA-256 (the rules'
      // limiters hash them), so a long value is limited like any other; an
      // INVALID_ARGUMENT here would let Envoy's default failure mode admit
      // it. Beyond this bound (Envoy's own header limit is 60 KiB) the
      // descriptor is malformed.
      const size_t key_length = StateKeyLength(request.domain(), entries);
      if (key_length > kMaxStateKeyBytes) {
        return Invalid(Cat("descriptors[", i, "]: the domain and entries make a key of ", key_length,
                           " bytes, the most is ", kMaxStateKeyBytes));
      }
      item.cost = request_cost;
      if (d.has_hits_addend()) {
        if (d.hits_addend().value() > static_cast<uint64_t>(kMaxLimit)) {
          return Invalid(Cat("descriptors[", i, "].hits_addend: ", d.hits_addend().value(),
                             " is more than the most a limit can hold (", kMaxLimit, ")"));
        }
        item.cost = static_cast<int64_t>(d.hits_addend().value());
      }
      if (d.has_limit()) {
        const int unit = static_cast<int>(d.limit().unit());
        if (unit < 1 || unit > 7) {
          return Invalid(Cat("descriptors[", i, "].limit.unit: ", unit,
                             " is not a unit (SECOND=1 .. YEAR=6)"));
        }
      }
      if (domain == nullptr) continue;  // unknown domain: no limit, as Envoy expects
      if (d.has_limit()) {
        // As in envoyproxy/ratelimit: the request's own limit, for a known domain.
        absl::StatusOr<const Rule*> rule =
            overrides_.Get(d.limit().requests_per_unit(), static_cast<EnvoyUnit>(d.limit().unit()));
        if (!rule.ok()) return grpc::Status(ToGrpc(rule.status().code()), std::string(rule.status().message()));
        item.rule = *rule;
      } else {
        item.rule = domain->Match(entries);
      }
      if (item.rule != nullptr) item.key = StateKey(request.domain(), entries);
    }
    // `replaces`: a limit that applies removes the named limits from this call.
    absl::flat_hash_set<std::string> replaced;
    for (const Item& item : call.items) {
      if (item.rule == nullptr) continue;
      for (const std::string& name : item.rule->replaces) replaced.insert(name);
    }
    if (!replaced.empty()) {
      for (Item& item : call.items) {
        if (item.rule != nullptr && !item.rule->limit_name.empty() &&
            replaced.contains(item.rule->limit_name)) {
          item.rule = nullptr;
        }
      }
    }
    return grpc::Status::OK;
  }

  const Clock& clock_;
  Overrides overrides_;
  std::atomic<std::shared_ptr<const RlsServer::Snapshot>> snapshot_;
  std::array<server::Counter*, 4> results_{};
  std::atomic<int64_t> in_flight_{0};
};

void Call::Complete() {
  const std::vector<Item>& all = items;
  // An error (a key the store refused, a store without on_store_error
  // cover) fails the whole call; Envoy then applies its failure_mode_deny.
  std::optional<absl::Status> error;
  bool over = false;
  for (const Item& item : all) {
    if (item.rule == nullptr || item.rule->shadow) continue;
    if (item.rule->kind == Rule::Kind::kDenyAll) over = true;
    if (item.decision && !item.decision->ok() && !error) error = item.decision->status();
    if (item.decision && item.decision->ok() && !(*item.decision)->allowed) over = true;
  }
  // All-or-nothing, as for the HTTP policies: a denied request does not
  // consume quota, so what the other descriptors took is given back.
  const bool refund = over || error.has_value();
  for (const Item& item : all) {
    if (refund && item.decision && item.decision->ok() && (*item.decision)->allowed &&
        item.cost > 0) {
      (void)item.rule->limiter->Refund(item.key, **item.decision, item.cost);
    }
  }
  if (error) {
    service->Finish(*this, grpc::Status(ToGrpc(error->code()), std::string(error->message())));
    return;
  }

  std::vector<server::PolicyAnswer> answers;
  std::vector<std::string> violated;
  Duration retry;
  Duration jitter;
  bool retry_known = false;
  response->set_overall_code(over ? rls::RateLimitResponse::OVER_LIMIT : rls::RateLimitResponse::OK);
  for (const Item& item : all) {
    rls::RateLimitResponse::DescriptorStatus* status = response->add_statuses();
    status->set_code(rls::RateLimitResponse::OK);
    const Rule* rule = item.rule;
    if (rule == nullptr) continue;  // no limit: OK, nothing more to say
    if (rule->kind == Rule::Kind::kUnlimited) {
      status->set_limit_remaining(std::numeric_limits<uint32_t>::max());
      continue;
    }
    rls::RateLimitResponse::RateLimit* limit = status->mutable_current_limit();
    limit->set_requests_per_unit(rule->requests_per_unit);
    limit->set_unit(static_cast<rls::RateLimitResponse::RateLimit::Unit>(rule->unit));
    limit->set_name(rule->limit_name);

    PolicyDecision d;
    if (rule->kind == Rule::Kind::kDenyAll) {
      // requests_per_unit: 0. Nothing ever passes, so no Retry-After; the
      // window still resets on its boundary, as envoyproxy/ratelimit says.
      const int64_t unit_us = EnvoyUnitLength(rule->unit).micros();
      d.allowed = false;
      d.retry_after = Duration::Infinite();
      d.reset_after = Duration::Micros(unit_us - (now.unix_micros() % unit_us + unit_us) % unit_us);
    } else {
      d = **item.decision;
      // Given back above: what is left is what was left before this call.
      if (refund && d.allowed) d.remaining = std::min(d.limit, d.remaining + item.cost);
    }
    const bool denied = !d.allowed;
    if (denied && rule->shadow) {
      rule->Count(Rule::kShadowDenied);
    } else {
      rule->Count(denied ? Rule::kDenied : Rule::kAllowed);
    }
    status->set_code(denied && !rule->shadow ? rls::RateLimitResponse::OVER_LIMIT
                                             : rls::RateLimitResponse::OK);
    status->set_limit_remaining(Clamp32(d.remaining));
    SetDuration(denied && !d.can_never_pass() ? d.retry_after : d.reset_after,
                *status->mutable_duration_until_reset());
    if (rule->shadow) continue;  // a trial: clients are not told about it
    if (denied) {
      violated.push_back(rule->header_name);
      if (!d.can_never_pass() && (!retry_known || d.retry_after > retry)) {
        retry = d.retry_after;
        jitter = rule->jitter;
        retry_known = true;
      }
    }
    answers.push_back({.name = rule->header_name, .decision = d,
                       .window_seconds = rule->window_seconds, .shadow = false});
  }

  std::vector<std::pair<std::string, std::string>> headers;
  server::AppendRateLimitHeaders(answers, snapshot->legacy_headers, headers);
  if (over) {
    if (retry_known) {
      thread_local std::mt19937_64 rng{std::random_device{}()};
      headers.emplace_back("Retry-After", Cat(server::RetryAfterSeconds(retry, jitter, rng)));
    }
    headers.emplace_back("Content-Type", "application/problem+json");
    response->set_raw_body(server::ProblemBody(
        429, violated,
        retry_known ? Cat("rate limit exceeded; retry after ", retry.CeilMillis(), " ms")
                    : std::string("rate limit exceeded; this request can never pass")));
  }
  for (auto& [name, value] : headers) {
    auto* h = response->add_response_headers_to_add();
    h->set_key(std::move(name));
    h->set_value(std::move(value));
  }
  service->Finish(*this, grpc::Status::OK);
}

// Gate: the connections to grpc.listen, accepted by sluice and handed to
// gRPC one by one (grpc::AddInsecureChannelFromFd).
//
// Why not gRPC's own listener: gRPC 1.51 accepts every connection offered
// and has no cap on their number (grpc.max_allowed_incoming_connections
// came in a later release); one that never sends a byte is kept for its
// handshake timeout, 120 s by default. Each holds a file descriptor, shared
// with the HTTP and admin listeners, so a few hundred idle TCP connections
// used to leave the whole process unable to accept anything. The gate
// refuses connections beyond max_connections at once, closes those that
// send nothing within handshake_timeout, and hands the others to gRPC,
// whose channel arguments then close idle and old ones (see Init).
//
// gRPC does not say when it closes a connection, so the gate looks: it
// keeps each descriptor it handed over with its socket's inode, and one
// that is closed, or now names another file, is gone. It looks every
// second, and when a new connection finds the gate full (at most every
// 100 ms, so a flood of refused connections costs a bounded amount of
// work): a slot gRPC freed is seen within that time.
//
// One thread, its own: Start runs it, Stop ends it; the rest is private to it.
class Gate {
 public:
  struct Options {
    int64_t max_connections = 1;
    Duration handshake_timeout;
  };

  // Listens on `where` (its first address, as the HTTP listeners do);
  // nothing is accepted before Start.
  static absl::StatusOr<std::unique_ptr<Gate>> Listen(const HostPort& where, Options options,
                                                      server::Metrics& metrics) {
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
    auto gate = std::unique_ptr<Gate>(new Gate(options, metrics));
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
    gate->port_ = ntohs(bound.ss_family == AF_INET6
                            ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                            : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    return gate;
  }

  ~Gate() {
    Stop();
    for (int fd : {epoll_, wake_}) {
      if (fd >= 0) close(fd);
    }
  }

  // Accepts on a thread of its own; `hand_off` takes each connection that
  // sent its first bytes, and with it the descriptor.
  void Start(std::function<void(int fd)> hand_off) {
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
  void Stop() {
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

  uint16_t port() const { return port_; }

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

  Gate(Options options, server::Metrics& metrics)
      : options_(options),
        open_(std::make_shared<std::atomic<int64_t>>(0)),
        refused_(metrics.Get("sluice_grpc_connections_refused_total", {})),
        handshake_timeouts_(metrics.Get("sluice_grpc_handshake_timeouts_total", {})),
        metrics_(metrics) {
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
      const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()),
                               WaitMs(Clock::now()));
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
        close(fd);  // full: refuse at once
        refused_->Add();
        continue;
      }
      if (!Watch(fd, EPOLLIN | EPOLLRDHUP)) {
        close(fd);
        continue;
      }
      const uint64_t seq = ++seq_;
      pending_[fd] = seq;
      waiting_.push_back({now + std::chrono::microseconds(options_.handshake_timeout.micros()),
                          fd, seq});
      Publish();
    }
  }

  // Out of descriptors (or socket memory): accept fails at once for as long
  // as it lasts, and the connection stays queued, so the listener is left
  // out of the wait for a moment rather than spun on.
  void Pause(int e) {
    const bool fds = e == EMFILE || e == ENFILE;
    metrics_.Get("sluice_accept_errors_total",
                 {{"listener", "grpc"}, {"reason", fds ? "fd_limit" : "memory"}})
        ->Add();
    epoll_event ev{};
    ev.data.fd = listener_;
    if (epoll_ctl(epoll_, EPOLL_CTL_MOD, listener_, &ev) == 0) paused_ = true;
    const Clock::time_point now = Clock::now();
    resume_at_ = now + kAcceptBackoff;
    if (now >= next_accept_log_) {
      next_accept_log_ = now + kAcceptLogInterval;
      spdlog::error("event=accept_error listener=grpc reason={} error=\"{}\" backoff_ms={} "
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

  void Expire(Clock::time_point now) {
    bool changed = false;
    while (!waiting_.empty() && waiting_.front().deadline <= now) {
      const Waiting w = waiting_.front();
      waiting_.pop_front();
      auto it = pending_.find(w.fd);
      if (it == pending_.end() || it->second != w.seq) continue;  // handed off or gone
      pending_.erase(it);
      epoll_ctl(epoll_, EPOLL_CTL_DEL, w.fd, nullptr);
      close(w.fd);
      handshake_timeouts_->Add();
      changed = true;
    }
    if (changed) Publish();
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
  server::Counter* refused_;
  server::Counter* handshake_timeouts_;
  server::Metrics& metrics_;
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

class RlsServerImpl final : public RlsServer {
 public:
  explicit RlsServerImpl(RuleOptions options) : options_(options) {}

  ~RlsServerImpl() override {
    Shutdown(Duration::Zero());
    Wait();
  }

  absl::Status Init(const Config& config) {
    absl::StatusOr<std::shared_ptr<const Snapshot>> snapshot = Build(config, nullptr);
    if (!snapshot.ok()) return snapshot.status();
    current_ = *snapshot;
    service_ = std::make_unique<Service>(options_, *options_.metrics, *snapshot);

    started_with_ = config.grpc;
    const GrpcConfig& grpc = *config.grpc;
    // The listener is the gate's (see Gate); the server has no port of its own.
    absl::StatusOr<std::unique_ptr<Gate>> gate =
        Gate::Listen(grpc.listen, {.max_connections = grpc.max_connections,
                                   .handshake_timeout = grpc.handshake_timeout},
                     *options_.metrics);
    if (!gate.ok()) return gate.status();
    grpc::ServerBuilder builder;
    // gRPC closes a connection idle (no call in progress) this long, and
    // tells one this old to go away (GOAWAY), then closes it after the grace.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, Millis(grpc.idle_timeout));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, Millis(grpc.max_connection_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               Millis(grpc.max_connection_age_grace));
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) return absl::UnavailableError("cannot start the gRPC server");
    gate_ = *std::move(gate);
    gate_->Start([server = server_.get()](int fd) { grpc::AddInsecureChannelFromFd(server, fd); });
    port_ = gate_->port();
    spdlog::info("event=start listener=grpc listen={}:{} domains={} max_connections={}",
                 grpc.listen.host, port_, config.envoy ? config.envoy->domains.size() : 0,
                 grpc.max_connections);
    if (rlimit limit{}; getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        static_cast<uint64_t>(grpc.max_connections) >= limit.rlim_cur) {
      spdlog::warn("event=start listener=grpc note=\"grpc.max_connections ({}) is not below the "
                   "open file limit ({}): connections to grpc.listen alone can use up every file "
                   "descriptor; lower it or raise the limit\"",
                   grpc.max_connections, static_cast<uint64_t>(limit.rlim_cur));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<const Snapshot>> Prepare(const Config& config) const override {
    if (config.grpc != started_with_) {
      spdlog::warn("event=reload note=\"changes to grpc take effect at the next start\"");
    }
    std::shared_ptr<const Snapshot> before;
    {
      std::lock_guard lock(mu_);
      before = current_;
    }
    return Build(config, before ? before->rules.get() : nullptr);
  }

  void Swap(std::shared_ptr<const Snapshot> next) override {
    {
      std::lock_guard lock(mu_);
      current_ = next;
    }
    service_->Swap(std::move(next));
  }

  void Shutdown(Duration within) override {
    std::lock_guard lock(mu_);
    if (server_ == nullptr || shutdown_.joinable()) return;
    const auto deadline = std::chrono::system_clock::now() + std::chrono::microseconds(within.micros());
    // Server::Shutdown blocks, and the caller (an event loop draining HTTP at
    // the same time) must not. It also waits, after the calls in flight, for
    // every client to close its connection, which an idle client (Envoy
    // holds its connections open) may not do before the deadline; so once
    // the calls in flight are done, the connections are closed from here.
    shutdown_ = std::thread([server = server_.get(), service = service_.get(),
                             gate = gate_.get(), deadline] {
      gate->Stop();  // no new connections: none may reach gRPC once it shuts down
      std::thread graceful([server, deadline] { server->Shutdown(deadline); });
      // Give Shutdown a moment to stop new calls before counting the last ones.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      while (service->in_flight() > 0 && std::chrono::system_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      grpc_server_cancel_all_calls(server->c_server());
      graceful.join();
    });
  }

  void Wait() override {
    std::thread t;
    {
      std::lock_guard lock(mu_);
      t = std::move(shutdown_);
    }
    if (t.joinable()) t.join();
    if (server_ != nullptr) server_->Wait();
  }

  uint16_t port() const override { return port_; }

 private:
  absl::StatusOr<std::shared_ptr<const Snapshot>> Build(const Config& config,
                                                        const RuleSet* previous) const {
    absl::StatusOr<std::shared_ptr<const RuleSet>> rules =
        RuleSet::Create(config.envoy.get(), options_, previous);
    if (!rules.ok()) return rules.status();
    auto snapshot = std::make_shared<Snapshot>();
    snapshot->rules = *std::move(rules);
    snapshot->legacy_headers = config.server.legacy_headers;
    return std::shared_ptr<const Snapshot>(std::move(snapshot));
  }

  RuleOptions options_;
  std::optional<GrpcConfig> started_with_;
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> current_;
  std::unique_ptr<Service> service_;      // declared before server_: outlives it
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Gate> gate_;            // declared after server_: stopped before it goes
  std::thread shutdown_;
  uint16_t port_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RlsServer>> RlsServer::Start(const Config& config,
                                                            const RuleOptions& options) {
  if (!config.grpc) return absl::InvalidArgumentError("grpc.listen is not set");
  if (options.local == nullptr || options.clock == nullptr || options.metrics == nullptr) {
    return absl::InvalidArgumentError("RlsServer: a store, a clock and metrics are required");
  }
  auto server = std::make_unique<RlsServerImpl>(options);
  if (absl::Status s = server->Init(config); !s.ok()) return s;
  return std::unique_ptr<RlsServer>(std::move(server));
}

}  // namespace sluice::envoy
