// Fuzz target: an Envoy ShouldRateLimit request (RLS v3) as the rate limit
// service decides it: the protobuf parsed from the bytes (or, for bytes that
// start with `{`, from JSON, as POST /json reads it), then the service's
// own handler (its checks and bounds, the rules' match, the request's limit
// overrides, `replaces`, the decisions and the answer: statuses, headers,
// body), on the rules of a fixed config and a memory store whose clock
// stands still.
//
// The handler is the service's ShouldRateLimit (envoy/rls_service.h), which
// gRPC calls. It is called here without a network: its context is unused,
// its decisions by in-process limits complete before it returns, and the
// reactor it returns (which gRPC would run) is released here.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/json_util.h>

#include "envoy/rls_service.h"
#include "metrics/metrics.h"
#include "policy/envoy_rules.h"
#include "sluice/clock.h"
#include "sluice/config.h"
#include "sluice/store/memory_store.h"

namespace {

namespace rls = ::envoy::service::ratelimit::v3;
using sluice::envoy::RlsServer;

// The rules of tests/envoy: envoyproxy/ratelimit's own keys (values,
// wildcards, nesting, unlimited, requests_per_unit 0, shadow_mode, named
// limits and replaces) and sluice's (algorithms, windows, burst).
constexpr std::string_view kConfig = R"yaml(
grpc: {listen: 127.0.0.1:0}
envoy:
  - domain: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: remote_address
        value: 50.0.0.5
        rate_limit: {unit: second, requests_per_unit: 0}
      - key: path
        value: /health
        rate_limit: {unlimited: true}
      - key: path
        value: /login
        descriptors:
          - key: remote_address
            rate_limit: {unit: hour, requests_per_unit: 2}
  - domain: api
    descriptors:
      - key: service
        value: orders
        descriptors:
          - key: user
            value: user-a
            shadow_mode: true
            rate_limit: {unit: minute, requests_per_unit: 1, name: trial}
          - key: user
            value: team-*
            rate_limit: {unit: minute, requests_per_unit: 2, name: team}
          - key: user
            rate_limit: {unit: hour, requests_per_unit: 5, name: per_user}
      - key: plan
        value: free
        rate_limit: {unit: day, requests_per_unit: 1, name: free_daily}
      - key: plan
        value: premium
        rate_limit: {unit: day, requests_per_unit: 1000, replaces: [{name: free_daily}]}
      - key: region
        value: "eu-*-*1"
        rate_limit: {unit: minute, requests_per_unit: 10}
  - domain: ext
    descriptors:
      - key: client
        rate_limit: {algorithm: token_bucket, rate: 2/s, burst: 4}
      - key: tenant
        rate_limit: {algorithm: sliding_window, rate: 3/10s, name: tenant_window}
      - key: device
        rate_limit: {algorithm: gcra, limit: 60, period: 1m, burst: 2}
      - key: meter
        rate_limit: {algorithm: leaky_bucket, rate: 5/s, burst: 5}
      - key: log
        rate_limit: {algorithm: sliding_log, rate: 5/min}
)yaml";

struct Fixture {
  sluice::ManualClock clock{sluice::Time::FromUnixMicros(int64_t{1'700'006'400} * 1'000'000)};
  sluice::MemoryStore store{{.max_keys = 4096}};
  sluice::metrics::Metrics metrics;
  std::unique_ptr<rls::RateLimitService::CallbackService> service;
};

[[noreturn]] void Fail(const absl::Status& status) {
  std::fprintf(stderr, "fuzz fixture: %s\n", std::string(status.message()).c_str());
  std::abort();
}

Fixture& TheFixture() {
  static Fixture* fixture = [] {
    auto* f = new Fixture;
    absl::StatusOr<sluice::Config> config = sluice::ParseConfig(kConfig, "fuzz.yaml");
    if (!config.ok()) Fail(config.status());
    const sluice::policy::RuleOptions options{
        .local = &f->store, .clock = &f->clock, .metrics = &f->metrics};
    auto rules = sluice::policy::RuleSet::Create(config->envoy.get(), options, nullptr);
    if (!rules.ok()) Fail(rules.status());
    auto snapshot = std::make_shared<RlsServer::Snapshot>();
    snapshot->rules = *std::move(rules);
    snapshot->legacy_headers = true;
    f->service = sluice::envoy::MakeService(options, f->metrics, std::move(snapshot));
    return f;
  }();
  return *fixture;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in a string field is logged
  TheFixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  rls::RateLimitRequest request;
  // An input that starts with `{` is read as the decision API's POST /json
  // reads its body (protobuf's JSON form), its answer written back as JSON;
  // any other as the binary message gRPC delivers.
  const bool json = size > 0 && data[0] == '{';
  if (json) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    if (!google::protobuf::util::JsonStringToMessage(text, &request,
                                                     google::protobuf::util::JsonParseOptions())
             .ok()) {
      return 0;
    }
  } else if (!request.ParseFromArray(data, static_cast<int>(size))) {
    return 0;
  }
  rls::RateLimitResponse response;
  grpc::ServerUnaryReactor* reactor = TheFixture().service->ShouldRateLimit(
      static_cast<grpc::CallbackServerContext*>(nullptr), &request, &response);
  // Answered (in-process limits decide before the handler returns): one
  // status per descriptor, or none when the request was refused.
  if (response.statuses_size() != 0 && response.statuses_size() != request.descriptors_size()) {
    __builtin_trap();
  }
  if (json) {
    std::string answer;
    if (!google::protobuf::util::MessageToJsonString(response, &answer).ok()) __builtin_trap();
  }
  reactor->OnDone();  // what gRPC calls once the answer is sent: frees it
  return 0;
}
