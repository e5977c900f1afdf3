// `sluice serve`'s gRPC listener as a process, on a Redis of the test's
// own: the quota service across two of them (the Envoys of both share each
// bucket's limit, never more than it in all: each instance assigns only
// what it claimed in Redis; the claims sum to at most the limit), and
// gRPC's health service following the Redis.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "envoy/rlqs_test_support.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "redis/redis_server.h"

namespace sluice::envoy {
namespace {

namespace rlqs = ::envoy::service::rate_limit_quota::v3;

// A `sluice serve` of the test's own, on `config`; stopped (SIGTERM, by
// its PID) when it goes. Its gRPC port is read from its start log.
class Serve {
 public:
  static std::unique_ptr<Serve> Start(const std::string& dir, const std::string& config) {
    const std::string path = dir + "/sluice.yaml";
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return nullptr;
    std::fputs(config.c_str(), f);
    std::fclose(f);
    int out[2];
    if (pipe(out) != 0) return nullptr;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(out[1], 2);
      close(out[0]);
      close(out[1]);
      execl(SLUICE_BINARY, SLUICE_BINARY, "serve", "--config", path.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    auto serve = std::unique_ptr<Serve>(new Serve(pid, out[0]));
    // "event=start listener=grpc listen=127.0.0.1:PORT ..."
    const std::string marker = "listener=grpc listen=127.0.0.1:";
    std::string log;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{.fd = out[0], .events = POLLIN, .revents = 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      log.append(buf, static_cast<size_t>(n));
      if (const size_t at = log.find(marker); at != std::string::npos) {
        const size_t digits = at + marker.size();
        const size_t stop = log.find_first_not_of("0123456789", digits);
        if (stop != std::string::npos) {
          serve->port_ = std::stoi(log.substr(digits, stop - digits));
          // The rest of its log is read and dropped: a full pipe would
          // stall it.
          serve->drain_ = std::thread([fd = out[0]] {
            char sink[4096];
            while (read(fd, sink, sizeof sink) > 0) {
            }
          });
          return serve;
        }
      }
    }
    ADD_FAILURE() << "sluice serve did not start:\n" << log;
    return nullptr;
  }
  ~Serve() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    if (drain_.joinable()) drain_.join();  // the pipe's writer is gone: EOF
    close(log_);
  }
  int port() const { return port_; }

 private:
  Serve(pid_t pid, int log) : pid_(pid), log_(log) {}
  pid_t pid_;
  int log_;
  int port_ = 0;
  std::thread drain_;
};

// Two `sluice serve` on one Redis. Envoy 0 on the first wants 1000 a
// second; Envoys 1 and 2 on the second want 1000 and 10. The instances
// split 500 by their wants (500 each, capped at the limit): 250 and 250;
// the second gives 10 and 240.
TEST(RlqsFleetTest, TwoServeProcessesShareOneLimit) {
  absl::StatusOr<std::unique_ptr<test::RedisServer>> redis_server = test::RedisServer::Start();
  ASSERT_TRUE(redis_server.ok()) << redis_server.status();
  const std::string config = std::string(R"(
server: {listen: 127.0.0.1:0, admin: 127.0.0.1:0}
store:
  redis: {url: "redis://127.0.0.1:)") +
                             std::to_string((*redis_server)->port()) + R"("}
grpc:
  listen: 127.0.0.1:0
rlqs:
  assignment_ttl: 1s
  domains:
    - domain: web
      buckets:
        - match: {name: api}
          rate: 500/s
)";
  char dir_template[] = "/tmp/sluice-rlqs-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::vector<std::unique_ptr<Serve>> serves;
  std::vector<std::unique_ptr<rlqs::RateLimitQuotaService::Stub>> stubs;
  for (int i = 0; i < 2; ++i) {
    const std::string dir = std::string(dir_template) + "/" + std::to_string(i);
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    serves.push_back(Serve::Start(dir, config));
    ASSERT_NE(serves.back(), nullptr);
    stubs.push_back(rlqs::RateLimitQuotaService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(serves.back()->port()), grpc::InsecureChannelCredentials())));
  }
  const rlqs_test::PlayResult played = rlqs_test::PlayEnvoys(
      {{stubs[0].get(), 1000}, {stubs[1].get(), 1000}, {stubs[1].get(), 10}},
      [](const std::vector<double>& rate) {
        return std::abs(rate[0] - 250) < 3 && std::abs(rate[1] - 240) < 3 &&
               std::abs(rate[2] - 10) < 0.5;
      },
      std::chrono::seconds(20));
  EXPECT_TRUE(played.converged) << played.latest[0] << ", " << played.latest[1] << ", "
                                << played.latest[2];
  // The latest assignments of the three, across both processes, never
  // summed past the limit.
  EXPECT_LE(played.worst_sum, 500 + 1e-6);
  // The claims in Redis: one per instance, together within the limit
  // (micro-requests per second).
  redisContext* c = redisConnect("127.0.0.1", (*redis_server)->port());
  ASSERT_NE(c, nullptr);
  auto* r = static_cast<redisReply*>(redisCommand(c, "HVALS %s", "sluice:rlqs:{web\x1fname=api}"));
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
  EXPECT_EQ(r->elements, 2u);
  long long claims = 0;
  for (size_t i = 0; i < r->elements; ++i) claims += std::stoll(r->element[i]->str);
  EXPECT_LE(claims, 500'000'000);
  EXPECT_GE(claims, 490'000'000);
  freeReplyObject(r);
  redisFree(c);
  serves.clear();
  std::filesystem::remove_all(dir_template);
}

// gRPC's health service says NOT_SERVING while the shared store is
// unreachable, as /readyz does, and SERVING again once it is back.
TEST(ServeHealthTest, NotServingWhileRedisIsDown) {
  absl::StatusOr<std::unique_ptr<test::RedisServer>> redis_server = test::RedisServer::Start();
  ASSERT_TRUE(redis_server.ok()) << redis_server.status();
  char dir[] = "/tmp/sluice-health-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::unique_ptr<Serve> serve =
      Serve::Start(dir,
                   "server: {listen: 127.0.0.1:0, admin: 127.0.0.1:0}\n"
                   "store:\n  redis: {url: \"redis://127.0.0.1:" +
                       std::to_string((*redis_server)->port()) +
                       "\", timeout: 100ms}\n"
                       "grpc: {listen: 127.0.0.1:0}\n");
  ASSERT_NE(serve, nullptr);
  namespace health = ::grpc::health::v1;
  const auto stub = health::Health::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(serve->port()), grpc::InsecureChannelCredentials()));
  // The status once it is `want`, within 10 s; the last seen otherwise.
  const auto becomes = [&](health::HealthCheckResponse::ServingStatus want) {
    health::HealthCheckResponse r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    do {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      health::HealthCheckRequest request;
      request.set_service("ratelimit");
      r.Clear();
      if (stub->Check(&context, request, &r).ok() && r.status() == want) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (std::chrono::steady_clock::now() < deadline);
    return r.status();
  };
  EXPECT_EQ(becomes(health::HealthCheckResponse::SERVING), health::HealthCheckResponse::SERVING);
  ASSERT_TRUE((*redis_server)->Kill().ok());
  EXPECT_EQ(becomes(health::HealthCheckResponse::NOT_SERVING),
            health::HealthCheckResponse::NOT_SERVING);
  ASSERT_TRUE((*redis_server)->Restart().ok());
  EXPECT_EQ(becomes(health::HealthCheckResponse::SERVING), health::HealthCheckResponse::SERVING);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sluice::envoy
