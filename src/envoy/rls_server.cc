// The Envoy rate limit service on gRPC: the generated RateLimitService, its
// one handler, and the server around them, whose connections a
// ConnectionGate (connection_gate.h) accepts and bounds. All gRPC code of
// `sluice serve` lives in this file (gRPC and protobuf headers are slow to
// compile).
#include "envoy/rls_server.h"

#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <grpc/grpc.h>
#include <grpc/impl/codegen/grpc_types.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_posix.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "base/cat.h"
#include "envoy/connection_gate.h"
#include "envoy/health_service.h"
#include "envoy/rlqs_service.h"
#include "envoy/rls_service.h"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "policy/evaluation.h"
#include "policy/headers.h"
#include "sluice/store/store.h"
#include "spdlog/spdlog.h"

namespace sluice::envoy {

using policy::DomainRules;
using policy::Entry;
using policy::Overrides;
using policy::Rule;
using policy::RuleOptions;
using policy::RuleSet;
using policy::StateKey;
using policy::StateKeyLength;

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
    case absl::StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case absl::StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case absl::StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    default:
      return grpc::StatusCode::INTERNAL;
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

// One descriptor of a call: what applies to it.
struct Item {
  const Rule* rule = nullptr;  // null: no limit
  std::string key;
  int64_t cost = 1;
  size_t applied = 0;  // its place in Call::applied (limited and deny-all rules)
};

class Service;

// Where a call's answer goes: gRPC's callback reactor, or an asynchronous
// call on a completion queue (AsyncCall, what the server runs).
class Answerer {
 public:
  virtual void Answer(const grpc::Status& status) = 0;

 protected:
  ~Answerer() = default;
};

// One ShouldRateLimit call in flight, until the policies' verdict completes
// it (on whatever thread it arrives).
// It lives in its answerer (a Reactor or an AsyncCall), which outlasts the
// verdict: gRPC gives the answerer back only after the answer is sent.
struct Call {
  Service* service = nullptr;
  Answerer* answerer = nullptr;
  rls::RateLimitResponse* response = nullptr;
  std::shared_ptr<const RlsServer::Snapshot> snapshot;  // keeps rules and limiters alive
  Time now;
  absl::InlinedVector<Item, 2> items;    // Envoy sends one or two descriptors a call, most often
  std::vector<policy::Applied> applied;  // what Evaluate decides

  void Complete(const policy::Verdict& verdict);
};

// The call's reactor: counts the call as in flight until gRPC is done with
// it (its status sent), which is what a drain waits for.
class Reactor final : public grpc::ServerUnaryReactor, public Answerer {
 public:
  explicit Reactor(std::atomic<int64_t>& in_flight) : in_flight_(in_flight) {
    in_flight_.fetch_add(1, std::memory_order_acq_rel);
  }
  void OnDone() override {
    in_flight_.fetch_sub(1, std::memory_order_acq_rel);
    delete this;
  }
  void Answer(const grpc::Status& status) override { Finish(status); }
  Call& call() { return call_; }

 private:
  std::atomic<int64_t>& in_flight_;
  Call call_;
};

// A request posted as JSON (RlsServer::DecideJson), counted as in flight
// until answered, as a gRPC call is.
class JsonCall final : public Answerer {
 public:
  JsonCall(std::atomic<int64_t>& in_flight, std::function<void(RlsServer::JsonAnswer)> done)
      : in_flight_(in_flight), done_(std::move(done)) {
    in_flight_.fetch_add(1, std::memory_order_acq_rel);
  }

  void Answer(const grpc::Status& status) override {
    RlsServer::JsonAnswer answer;
    if (!status.ok()) {
      answer = {.status = 400, .body = status.error_message()};
    } else if (std::string json;
               !google::protobuf::util::MessageToJsonString(response, &json).ok()) {
      answer = {.status = 500, .body = "the answer could not be written as JSON"};
    } else {
      const auto code = response.overall_code();
      answer = {.status = code == rls::RateLimitResponse::OVER_LIMIT ? 429
                          : code == rls::RateLimitResponse::UNKNOWN  ? 500
                                                                     : 200,
                .body = std::move(json)};
    }
    std::atomic<int64_t>& in_flight = in_flight_;
    std::function<void(RlsServer::JsonAnswer)> done = std::move(done_);
    delete this;
    done(std::move(answer));
    in_flight.fetch_sub(1, std::memory_order_acq_rel);
  }

  rls::RateLimitRequest request;
  rls::RateLimitResponse response;
  Call call;

 private:
  ~JsonCall() = default;

  std::atomic<int64_t>& in_flight_;
  std::function<void(RlsServer::JsonAnswer)> done_;
};

class Service final : public rls::RateLimitService::CallbackService {
 public:
  Service(const RuleOptions& options, metrics::Metrics& metrics,
          std::shared_ptr<const RlsServer::Snapshot> snapshot)
      : clock_(*options.clock), overrides_(options), snapshot_(std::move(snapshot)) {
    metrics.SetHelp("sluice_rls_requests_total",
                    "Envoy ShouldRateLimit calls answered, by result.");
    for (auto [i, name] :
         {std::pair{0, "ok"}, {1, "over_limit"}, {2, "invalid_argument"}, {3, "error"}}) {
      results_[i] = metrics.Get("sluice_rls_requests_total", {{"result", name}});
    }
  }

  void Swap(std::shared_ptr<const RlsServer::Snapshot> next) { snapshot_.store(std::move(next)); }
  int64_t in_flight() const { return in_flight_.load(std::memory_order_acquire); }

  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* context,
                                            const rls::RateLimitRequest* request,
                                            rls::RateLimitResponse* response) override {
    (void)context;
    auto* reactor = new Reactor(in_flight_);
    Handle(*request, response, reactor, reactor->call());
    return reactor;
  }

  // Decides `request` into `response`, then hands the status to `answerer`:
  // before it returns when every limit is in process, else on the store's
  // thread (no caller's thread ever waits). `call`, the answerer's, is
  // fresh.
  void Handle(const rls::RateLimitRequest& request, rls::RateLimitResponse* response,
              Answerer* answerer, Call& call) {
    call.service = this;
    call.answerer = answerer;
    call.response = response;
    call.snapshot = snapshot_.load();
    if (grpc::Status s = Prepare(request, call); !s.ok()) {
      Finish(call, s);
      return;
    }
    call.applied.reserve(call.items.size());
    for (Item& item : call.items) {
      if (item.rule == nullptr || item.rule->kind == Rule::Kind::kUnlimited) continue;
      item.applied = call.applied.size();
      call.applied.push_back({.policy = &item.rule->policy, .key = item.key, .cost = item.cost});
    }
    if (policy::InProcess(call.applied)) {
      call.Complete(policy::EvaluateNow(call.applied, call.now));
      return;
    }
    policy::Evaluate(call.applied, call.now,
                     [c = &call](policy::Verdict verdict) { c->Complete(verdict); });
  }

  std::atomic<int64_t>& in_flight_count() { return in_flight_; }

  // A request in protobuf's JSON form, decided as Handle decides it.
  void HandleJson(std::string_view body, std::function<void(RlsServer::JsonAnswer)> done) {
    auto* call = new JsonCall(in_flight_, std::move(done));
    google::protobuf::util::JsonParseOptions options;  // unknown fields refused, as protojson
    const auto parsed =
        google::protobuf::util::JsonStringToMessage(std::string(body), &call->request, options);
    if (!parsed.ok()) {
      call->call.answerer = call;
      call->call.response = &call->response;
      Finish(call->call, Invalid(Cat("the body is not a RateLimitRequest in JSON: ",
                                     std::string(parsed.message()))));
      return;
    }
    Handle(call->request, &call->response, call, call->call);
  }

  // The server's AsyncCalls that exist. Once the server is shut down it only
  // falls: each comes back from its queue, its call answered (one waiting
  // on the shared store when the store answers or gives up) or never
  // filled. Their queues may be shut down only at 0.
  std::atomic<int64_t>& async_calls() { return async_calls_; }

  void Finish(Call& call, const grpc::Status& status) {
    int result = 3;
    if (status.ok()) {
      result = call.response->overall_code() == rls::RateLimitResponse::OVER_LIMIT ? 1 : 0;
    } else if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      result = 2;
    }
    results_[result]->Add();
    call.answerer->Answer(status);
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
    absl::InlinedVector<Entry, 8> entries;
    call.items.resize(static_cast<size_t>(request.descriptors_size()));
    for (int i = 0; i < request.descriptors_size(); ++i) {
      const auto& d = request.descriptors(i);
      Item& item = call.items[static_cast<size_t>(i)];
      // No entries match no rule: OK without a limit, as envoyproxy/ratelimit
      // answers (with a `limit` override, that limit applies, as there).
      if (d.entries().empty() && !d.has_limit()) continue;
      if (d.entries_size() > kMaxEntries) {
        return Invalid(
            Cat("descriptors[", i, "]: ", d.entries_size(), " entries, the most is ", kMaxEntries));
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
        return Invalid(Cat("descriptors[", i, "]: the domain and entries make a key of ",
                           key_length, " bytes, the most is ", kMaxStateKeyBytes));
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
        if (!rule.ok())
          return grpc::Status(ToGrpc(rule.status().code()), std::string(rule.status().message()));
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
        // As envoyproxy/ratelimit, an unlimited rule stays unlimited.
        if (item.rule != nullptr && item.rule->kind != Rule::Kind::kUnlimited &&
            !item.rule->limit_name.empty() && replaced.contains(item.rule->limit_name)) {
          item.rule = nullptr;
        }
      }
    }
    return grpc::Status::OK;
  }

  const Clock& clock_;
  Overrides overrides_;
  std::atomic<std::shared_ptr<const RlsServer::Snapshot>> snapshot_;
  std::array<metrics::Counter*, 4> results_{};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> async_calls_{0};
};

// envoy_limit_headers, as envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED
// and LIMIT_REQUEST_HEADERS_ENABLED: the limit, what remains and the
// seconds to its reset of the status nearest its limit among those with a
// limit (the first with the least remaining), or of the last one over its
// limit; none when no status has a limit.
void AddLimitHeaders(const RlsServer::Snapshot& snapshot, rls::RateLimitResponse& response) {
  const rls::RateLimitResponse::DescriptorStatus* nearest = nullptr;
  for (const rls::RateLimitResponse::DescriptorStatus& status : response.statuses()) {
    if (!status.has_current_limit()) continue;
    if (status.code() == rls::RateLimitResponse::OVER_LIMIT || nearest == nullptr ||
        (nearest->code() != rls::RateLimitResponse::OVER_LIMIT &&
         status.limit_remaining() < nearest->limit_remaining())) {
      nearest = &status;
    }
  }
  if (nearest == nullptr) return;
  const google::protobuf::Duration& reset = nearest->duration_until_reset();
  // Whole seconds, rounded up: never sooner than the reset.
  const int64_t reset_s = reset.seconds() + (reset.nanos() > 0 ? 1 : 0);
  const std::string limit = std::to_string(nearest->current_limit().requests_per_unit());
  const std::string remaining = std::to_string(nearest->limit_remaining());
  const std::string reset_after = std::to_string(reset_s);
  for (const auto& [names, add] :
       {std::pair{&snapshot.response_limit_headers,
                  &rls::RateLimitResponse::add_response_headers_to_add},
        {&snapshot.request_limit_headers, &rls::RateLimitResponse::add_request_headers_to_add}}) {
    if (!names->has_value()) continue;
    const EnvoyLimitHeaders& n = **names;
    for (const auto& [name, value] :
         {std::pair{&n.limit, &limit}, {&n.remaining, &remaining}, {&n.reset, &reset_after}}) {
      auto* h = (response.*add)();
      h->set_key(*name);
      h->set_value(*value);
    }
  }
}

void Call::Complete(const policy::Verdict& verdict) {
  // An error (a key the store refused, a store without on_store_error
  // cover) fails the whole call; Envoy then applies its failure_mode_deny.
  if (!verdict.error.ok()) {
    service->Finish(
        *this, grpc::Status(ToGrpc(verdict.error.code()), std::string(verdict.error.message())));
    return;
  }
  // envoy_shadow_mode: the rules are shadows already; what is left over is a
  // limit the request gave itself, answered OK as envoyproxy/ratelimit does.
  const bool over = !verdict.allowed && !snapshot->shadow;
  response->set_overall_code(over ? rls::RateLimitResponse::OVER_LIMIT
                                  : rls::RateLimitResponse::OK);
  for (const Item& item : items) {
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
    // After a refund (the call was denied), what is left is what was left
    // before it.
    const PolicyDecision& d = verdict.answers[item.applied].decision;
    const bool denied = !d.allowed;
    status->set_code(denied && !rule->policy.shadow() ? rls::RateLimitResponse::OVER_LIMIT
                                                      : rls::RateLimitResponse::OK);
    // As envoyproxy/ratelimit: nothing remains for a descriptor over its
    // limit, even when a smaller cost would still pass (the RateLimit header
    // keeps saying what is left). A rule that admits nothing resets with its
    // window, as envoyproxy/ratelimit says.
    status->set_limit_remaining(denied ? 0 : Clamp32(d.remaining));
    SetDuration(denied && !d.can_never_pass() ? d.retry_after : d.reset_after,
                *status->mutable_duration_until_reset());
  }

  policy::FieldList headers;
  thread_local std::mt19937_64 rng{std::random_device{}()};
  verdict.AppendHeaders(applied, snapshot->legacy_headers, rng, headers);
  if (over) {
    headers.Add("Content-Type", "application/problem+json");
    response->set_raw_body(policy::ProblemBody(429, verdict.violated, verdict.detail));
  }
  for (const auto [name, value] : headers) {
    auto* h = response->add_response_headers_to_add();
    h->set_key(std::string(name));
    h->set_value(std::string(value));
  }
  if (snapshot->response_limit_headers || snapshot->request_limit_headers) {
    AddLimitHeaders(*snapshot, *response);
  }
  service->Finish(*this, grpc::Status::OK);
}

// One ShouldRateLimit call on a completion queue: requested from gRPC,
// then, once a client's call fills it, decided and answered; its tag comes
// back twice (the call arrived; the answer was sent) and it frees itself
// after the second. Each arrival requests the next call first.
class AsyncCall final : public Answerer {
 public:
  AsyncCall(Service& service, rls::RateLimitService::AsyncService& async,
            grpc::ServerCompletionQueue* cq)
      : service_(service),
        async_(async),
        cq_(cq),
        arena_(ArenaOptions(block_)),
        request_(google::protobuf::Arena::CreateMessage<rls::RateLimitRequest>(&arena_)),
        response_(google::protobuf::Arena::CreateMessage<rls::RateLimitResponse>(&arena_)),
        responder_(&context_) {
    service_.async_calls().fetch_add(1, std::memory_order_acq_rel);
    async_.RequestShouldRateLimit(&context_, request_, &responder_, cq_, cq_, this);
  }
  ~AsyncCall() { service_.async_calls().fetch_sub(1, std::memory_order_acq_rel); }

  // This call's tag came back from the queue, `ok` as gRPC says.
  void Proceed(bool ok) {
    if (!arrived_ && ok) {
      arrived_ = true;
      new AsyncCall(service_, async_, cq_);
      service_.in_flight_count().fetch_add(1, std::memory_order_acq_rel);
      service_.Handle(*request_, response_, this, call_);
      return;
    }
    if (arrived_) service_.in_flight_count().fetch_sub(1, std::memory_order_acq_rel);
    delete this;  // answered, or never filled (the server is stopping)
  }

  void Answer(const grpc::Status& status) override { responder_.Finish(*response_, status, this); }

 private:
  // The request's and the answer's fields are allocated from a block of the
  // call's own (more only for a large request), and freed with it at once.
  static constexpr size_t kArenaBlock = 2048;
  static google::protobuf::ArenaOptions ArenaOptions(char* block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = kArenaBlock;
    return options;
  }

  Service& service_;
  rls::RateLimitService::AsyncService& async_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext context_;
  alignas(8) char block_[kArenaBlock];
  google::protobuf::Arena arena_;
  rls::RateLimitRequest* request_;
  rls::RateLimitResponse* response_;
  grpc::ServerAsyncResponseWriter<rls::RateLimitResponse> responder_;
  Call call_;
  bool arrived_ = false;
};

class RlsServerImpl final : public RlsServer {
 public:
  explicit RlsServerImpl(RuleOptions options) : options_(options) {}

  // A completion queue and its thread per worker thread (server.threads:
  // ServerConfig::Loops), and calls requested ahead on each, so that an
  // arriving call finds one.
  static constexpr int kCallsRequestedPerQueue = 16;

  ~RlsServerImpl() override {
    Shutdown(Duration::Zero());
    Wait();
  }

  // A queue's thread: takes its events and proceeds with their calls. The
  // decisions asked while the queue has events ready are one turn of this
  // loop (sluice/store/store.h, LoopTurn): a remote store sends them
  // together, when the queue has nothing more ready.
  static void Poll(grpc::CompletionQueue& cq) {
    LoopTurnQueue turn;
    void* tag = nullptr;
    bool ok = false;
    for (;;) {
      if (turn.due() > 0) {
        const auto next = cq.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
        if (next != grpc::CompletionQueue::GOT_EVENT) {
          turn.End();
          if (next == grpc::CompletionQueue::SHUTDOWN) return;
          continue;
        }
      } else if (!cq.Next(&tag, &ok)) {
        return;
      }
      const InTurn in_turn(turn);
      static_cast<AsyncCall*>(tag)->Proceed(ok);
    }
  }

  absl::Status Init(const Config& config, std::function<bool()> ready) {
    absl::StatusOr<std::shared_ptr<const Snapshot>> snapshot = Build(config, nullptr);
    if (!snapshot.ok()) return snapshot.status();
    current_ = *snapshot;
    service_ = std::make_unique<Service>(options_, *options_.metrics, *snapshot);

    started_with_ = config.grpc;
    const GrpcConfig& grpc = *config.grpc;
    const int threads = config.server.Loops();
    // The listener is the gate's (connection_gate.h); the server has no port of its own.
    absl::StatusOr<std::unique_ptr<ConnectionGate>> gate =
        ConnectionGate::Listen(grpc.listen,
                               {.max_connections = grpc.max_connections,
                                .handshake_timeout = grpc.handshake_timeout,
                                .tls = (*snapshot)->tls,
                                .relay_threads = threads},
                               *options_.metrics);
    if (!gate.ok()) return gate.status();
    grpc::ServerBuilder builder;
    // gRPC closes a connection idle (no call in progress) this long, and
    // tells one this old to go away (GOAWAY), then closes it after the grace.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, Millis(grpc.idle_timeout));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, Millis(grpc.max_connection_age));
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               Millis(grpc.max_connection_age_grace));
    builder.RegisterService(&async_);
    for (int i = 0; i < threads; ++i) queues_.push_back(builder.AddCompletionQueue());
    if (config.rlqs.has_value()) {
      // With a shared store, the instances share each bucket's limit.
      Store* fleet =
          options_.shared != nullptr && options_.shared->remote() ? options_.shared : nullptr;
      rlqs_ =
          std::make_unique<RlqsService>(*config.rlqs, *options_.clock, *options_.metrics, fleet);
      builder.RegisterService(rlqs_.get());
    }
    std::vector<std::string> names = {"ratelimit", rls::RateLimitService::service_full_name()};
    if (rlqs_ != nullptr) {
      names.push_back(
          ::envoy::service::rate_limit_quota::v3::RateLimitQuotaService::service_full_name());
    }
    health_ = MakeHealthService(
        [this, ready = std::move(ready)] {
          return !shutting_down_.load(std::memory_order_relaxed) && (!ready || ready());
        },
        std::move(names));
    builder.RegisterService(health_.get());
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) return absl::UnavailableError("cannot start the gRPC server");
    for (auto& queue : queues_) {
      for (int i = 0; i < kCallsRequestedPerQueue; ++i)
        new AsyncCall(*service_, async_, queue.get());
      pollers_.emplace_back([cq = queue.get()] { Poll(*cq); });
      // Its name in `top -H` and /proc/<pid>/task/*/comm (15 characters at most).
      pthread_setname_np(pollers_.back().native_handle(), "sluice-grpc");
    }
    gate_ = *std::move(gate);
    gate_->Start([server = server_.get()](int fd) { grpc::AddInsecureChannelFromFd(server, fd); });
    port_ = gate_->port();
    spdlog::info(
        "event=start listener=grpc listen={} domains={} quota_domains={} max_connections={} "
        "tls={}",
        HostPortText({grpc.listen.host, port_}), config.envoy ? config.envoy->domains.size() : 0,
        config.rlqs ? config.rlqs->domains.size() : 0, grpc.max_connections,
        !grpc.tls                          ? "off"
        : grpc.tls->client_ca_file.empty() ? "on"
                                           : "mutual");
    if (rlimit limit{}; getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
                        static_cast<uint64_t>(grpc.max_connections) >= limit.rlim_cur) {
      spdlog::warn(
          "event=start listener=grpc note=\"grpc.max_connections ({}) is not below the "
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
    if (config.rlqs.has_value() != (rlqs_ != nullptr)) {
      spdlog::warn(
          "event=reload note=\"adding or removing rlqs takes effect at the next start; "
          "changes to its rules take effect now\"");
    }
    std::shared_ptr<const Snapshot> before;
    {
      std::lock_guard lock(mu_);
      before = current_;
    }
    return Build(config, before ? before->rules.get() : nullptr);
  }

  void Swap(std::shared_ptr<const Snapshot> next) override {
    bool rlqs_changed = false;
    {
      std::lock_guard lock(mu_);
      rlqs_changed = rlqs_ != nullptr && next->rlqs.has_value() &&
                     (current_ == nullptr || current_->rlqs != next->rlqs);
      current_ = next;
    }
    if (rlqs_changed) rlqs_->Reconfigure(*next->rlqs);
    gate_->SetTls(next->tls);  // connections accepted from now on
    service_->Swap(std::move(next));
  }

  void Shutdown(Duration within) override {
    shutting_down_.store(true, std::memory_order_relaxed);  // health checks: NOT_SERVING
    if (health_ != nullptr) health_->LookNow();             // watchers told before it goes
    std::lock_guard lock(mu_);
    if (server_ == nullptr || shutdown_.joinable()) return;
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::microseconds(within.micros());
    // Server::Shutdown blocks, and the caller (an event loop draining HTTP at
    // the same time) must not. It also waits, after the calls in flight, for
    // every client to close its connection, which an idle client (Envoy
    // holds its connections open) may not do before the deadline; so once
    // the calls in flight are done, the connections are closed from here.
    shutdown_ = std::thread(
        [server = server_.get(), service = service_.get(), gate = gate_.get(), deadline] {
          gate->Close();  // no new connections: none may reach gRPC once it shuts down
          std::thread graceful([server, deadline] { server->Shutdown(deadline); });
          // Give Shutdown a moment to stop new calls before counting the last ones.
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          while (service->in_flight() > 0 && std::chrono::system_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
          grpc_server_cancel_all_calls(server->c_server());
          graceful.join();
          gate->Stop();  // gRPC closed its ends: the relays of TLS connections end
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
    // The queues after the server (gRPC's rule) and after every call on
    // them came back: an answer still to come would be started on a queue
    // already shut down. Each poller ends once its queue is drained.
    if (pollers_.empty()) return;  // never started, or already waited for
    while (service_->async_calls().load(std::memory_order_acquire) > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (auto& queue : queues_) queue->Shutdown();
    for (std::thread& poller : pollers_) poller.join();
    pollers_.clear();
  }

  uint16_t port() const override { return port_; }

  void DecideJson(std::string_view body, std::function<void(JsonAnswer)> done) override {
    service_->HandleJson(body, std::move(done));
  }

  std::vector<QuotaBook::BucketView> QuotaBuckets() const override {
    return rlqs_ == nullptr ? std::vector<QuotaBook::BucketView>() : rlqs_->Buckets();
  }

 private:
  absl::StatusOr<std::shared_ptr<const Snapshot>> Build(const Config& config,
                                                        const RuleSet* previous) const {
    RuleOptions options = options_;
    options.shadow = config.envoy != nullptr && config.envoy->shadow_mode;
    absl::StatusOr<std::shared_ptr<const RuleSet>> rules =
        RuleSet::Create(config.envoy.get(), options, previous);
    if (!rules.ok()) return rules.status();
    auto snapshot = std::make_shared<Snapshot>();
    snapshot->rules = *std::move(rules);
    snapshot->legacy_headers = config.server.legacy_headers;
    snapshot->shadow = options.shadow;
    if (config.envoy != nullptr) {
      snapshot->response_limit_headers = config.envoy->response_limit_headers;
      snapshot->request_limit_headers = config.envoy->request_limit_headers;
    }
    snapshot->rlqs = config.rlqs;
    if (config.grpc.has_value() && config.grpc->tls.has_value()) {
      const ListenerTls& t = *config.grpc->tls;
      absl::StatusOr<std::shared_ptr<tls::Context>> context =
          tls::ServerContext({.cert_file = t.cert_file,
                              .key_file = t.key_file,
                              .ca_file = t.client_ca_file,
                              .peer_name = t.client_name,
                              .by_name = t.certificates},
                             "grpc.tls", tls::Protocol::kHttp2);
      if (!context.ok()) return context.status();
      snapshot->tls = *std::move(context);
    }
    return std::shared_ptr<const Snapshot>(std::move(snapshot));
  }

  RuleOptions options_;
  std::optional<GrpcConfig> started_with_;
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> current_;
  std::unique_ptr<Service> service_;           // declared before server_: outlives it
  rls::RateLimitService::AsyncService async_;  // the same
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;  // the same
  std::vector<std::thread> pollers_;       // one per queue: takes its calls, answers them
  std::unique_ptr<RlqsService> rlqs_;      // the same
  std::unique_ptr<HealthService> health_;  // the same
  std::atomic<bool> shutting_down_{false};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ConnectionGate> gate_;  // declared after server_: stopped before it goes
  std::thread shutdown_;
  uint16_t port_ = 0;
};

}  // namespace

std::unique_ptr<rls::RateLimitService::CallbackService> MakeService(
    const RuleOptions& options, metrics::Metrics& metrics,
    std::shared_ptr<const RlsServer::Snapshot> snapshot) {
  return std::make_unique<Service>(options, metrics, std::move(snapshot));
}

absl::StatusOr<std::unique_ptr<RlsServer>> RlsServer::Start(const Config& config,
                                                            const RuleOptions& options,
                                                            std::function<bool()> ready) {
  if (!config.grpc) return absl::InvalidArgumentError("grpc.listen is not set");
  if (options.local == nullptr || options.clock == nullptr || options.metrics == nullptr) {
    return absl::InvalidArgumentError("RlsServer: a store, a clock and metrics are required");
  }
  auto server = std::make_unique<RlsServerImpl>(options);
  if (absl::Status s = server->Init(config, std::move(ready)); !s.ok()) return s;
  return std::unique_ptr<RlsServer>(std::move(server));
}

}  // namespace sluice::envoy
