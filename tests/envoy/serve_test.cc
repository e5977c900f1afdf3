// End to end: the real `sluice serve` binary with `grpc.listen` on a free
// loopback port (port 0; the port is read from its start log line), called
// with gRPC stubs generated from the same protos. Covers start, decisions,
// a reload by SIGHUP that keeps the state of unchanged rules, and the
// SIGTERM drain. Each test stops the process it started, by its PID.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "redis/redis_server.h"

extern char** environ;

namespace {

namespace rls = ::envoy::service::ratelimit::v3;
using Response = rls::RateLimitResponse;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Serve : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/sluice_serve_envoy_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    // An envoyproxy/ratelimit file, next to the sluice config that names it.
    std::ofstream(dir_ + "/edge.yaml") << R"(domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: generic_key
    value: changing
    rate_limit: {unit: hour, requests_per_unit: 1}
)";
    WriteConfig();
  }

  void TearDown() override {
    for (pid_t pid : {pid_, other_pid_}) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    std::filesystem::remove_all(dir_);
  }

  void WriteConfig(const std::string& extra = "") {
    std::ofstream(dir_ + "/sluice.yaml")
        << "server: {listen: 127.0.0.1:0, admin: 127.0.0.1:0, threads: 2, drain_timeout: 5s}\n"
           "grpc: {listen: 127.0.0.1:0}\n"
           "envoy_files: [edge.yaml]\n"
        << extra;
  }

  // Starts the binary and waits for its gRPC listener's log line.
  void StartServer() { stub_ = Spawn(dir_ + "/sluice.yaml", dir_ + "/stderr.log", pid_); }

  // Starts the binary on `config`, its log in `log`, into `pid`; a stub on
  // its gRPC listener once the log names it (null, with a failure, if it
  // does not within 10 s).
  static std::unique_ptr<rls::RateLimitService::Stub> Spawn(const std::string& config,
                                                            const std::string& log, pid_t& pid) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    const char* argv[] = {SLUICE_BINARY, "serve", "--config", config.c_str(), nullptr};
    const int spawned =
        posix_spawn(&pid, SLUICE_BINARY, &actions, nullptr, const_cast<char**>(argv), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {
      ADD_FAILURE() << "posix_spawn: " << std::strerror(spawned);
      pid = -1;
      return nullptr;
    }
    const std::regex started(R"(event=start listener=grpc listen=127\.0\.0\.1:(\d+))");
    for (int i = 0; i < 500; ++i) {
      std::smatch m;
      const std::string text = ReadAll(log);
      if (std::regex_search(text, m, started)) {
        return rls::RateLimitService::NewStub(
            grpc::CreateChannel("127.0.0.1:" + m[1].str(), grpc::InsecureChannelCredentials()));
      }
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        ADD_FAILURE() << "sluice serve exited: " << text;
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "no gRPC listener within 10 s: " << ReadAll(log);
    return nullptr;
  }

  grpc::Status Call(const std::string& key, const std::string& value, Response& response) {
    rls::RateLimitRequest request;
    request.set_domain("edge");
    auto* e = request.add_descriptors()->add_entries();
    e->set_key(key);
    e->set_value(value);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->ShouldRateLimit(&context, request, &response);
  }
  Response::Code CodeOf(const std::string& key, const std::string& value) {
    Response r;
    const grpc::Status s = Call(key, value, r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return r.overall_code();
  }

  // Sends `sig` and waits for the exit; returns the exit status.
  int StopWith(int sig) {
    const auto start = std::chrono::steady_clock::now();
    kill(pid_, sig);
    int status = 0;
    for (int i = 0; i < 500; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        // Nothing is in flight: the drain does not wait for its deadline (5 s).
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "sluice serve did not exit within 10 s of signal " << sig;
    return -1;
  }

  std::string dir_;
  pid_t pid_ = -1;
  pid_t other_pid_ = -1;  // a second instance, when a test starts one
  std::unique_ptr<rls::RateLimitService::Stub> stub_;
};

TEST_F(Serve, AnswersShouldRateLimitOnItsGrpcListener) {
  StartServer();
  Response r;
  ASSERT_TRUE(Call("remote_address", "198.51.100.7", r).ok());
  EXPECT_EQ(r.overall_code(), Response::OK);
  ASSERT_EQ(r.statuses_size(), 1);
  EXPECT_EQ(r.statuses(0).current_limit().requests_per_unit(), 2u);
  EXPECT_EQ(r.statuses(0).current_limit().unit(), Response::RateLimit::HOUR);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(CodeOf("remote_address", "198.51.100.7"), Response::OK);
  ASSERT_TRUE(Call("remote_address", "198.51.100.7", r).ok());
  EXPECT_EQ(r.overall_code(), Response::OVER_LIMIT);
  EXPECT_FALSE(r.raw_body().empty());
  EXPECT_EQ(CodeOf("unknown_key", "x"), Response::OK);

  Response bad;
  rls::RateLimitRequest empty;
  grpc::ClientContext context;
  EXPECT_EQ(stub_->ShouldRateLimit(&context, empty, &bad).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(StopWith(SIGTERM), 0);  // drains and exits cleanly
}

// Two instances on one Redis (store.redis: the rules are global), each
// called by four threads at once: together they admit exactly the limit,
// however their decisions shared calls to Redis (those a queue's thread
// asks while it has calls ready go in one).
TEST_F(Serve, TwoInstancesOnOneRedisAdmitExactlyTheLimit) {
  absl::StatusOr<std::unique_ptr<sluice::test::RedisServer>> redis =
      sluice::test::RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  std::ofstream(dir_ + "/edge.yaml") << R"(domain: edge
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 60}
)";
  WriteConfig("store: {redis: {url: \"redis://127.0.0.1:" + std::to_string((*redis)->port()) +
              "\"}}\n");
  StartServer();
  ASSERT_NE(stub_, nullptr);
  std::unique_ptr<rls::RateLimitService::Stub> other =
      Spawn(dir_ + "/sluice.yaml", dir_ + "/other.log", other_pid_);
  ASSERT_NE(other, nullptr);
  constexpr int kThreads = 8;
  constexpr int kCalls = 40;
  std::atomic<int> ok{0};
  std::atomic<int> over{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, stub = t % 2 == 0 ? stub_.get() : other.get()] {
      for (int i = 0; i < kCalls; ++i) {
        rls::RateLimitRequest request;
        request.set_domain("edge");
        auto* e = request.add_descriptors()->add_entries();
        e->set_key("user");
        e->set_value("alice");
        Response r;
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        if (!stub->ShouldRateLimit(&context, request, &r).ok()) {
          failed.fetch_add(1);
        } else if (r.overall_code() == Response::OK) {
          ok.fetch_add(1);
        } else if (r.overall_code() == Response::OVER_LIMIT) {
          over.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(ok.load(), 60);
  EXPECT_EQ(over.load(), kThreads * kCalls - 60);
}

TEST_F(Serve, ReloadAppliesNewRulesAndKeepsTheStateOfUnchangedOnes) {
  StartServer();
  EXPECT_EQ(CodeOf("remote_address", "203.0.113.1"), Response::OK);
  EXPECT_EQ(CodeOf("remote_address", "203.0.113.1"), Response::OK);
  EXPECT_EQ(CodeOf("generic_key", "changing"), Response::OK);
  EXPECT_EQ(CodeOf("generic_key", "changing"), Response::OVER_LIMIT);

  // generic_key=changing becomes unlimited; a new domain appears inline.
  std::ofstream(dir_ + "/edge.yaml") << R"(domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: generic_key
    value: changing
    rate_limit: {unlimited: true}
)";
  WriteConfig(
      "envoy:\n  - domain: added\n    descriptors:\n"
      "      - {key: k, rate_limit: {unit: minute, requests_per_unit: 0}}\n");
  kill(pid_, SIGHUP);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (CodeOf("generic_key", "changing") != Response::OK &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(CodeOf("generic_key", "changing"), Response::OK);
  EXPECT_EQ(CodeOf("remote_address", "203.0.113.1"), Response::OVER_LIMIT);  // state kept

  rls::RateLimitRequest request;
  request.set_domain("added");
  auto* e = request.add_descriptors()->add_entries();
  e->set_key("k");
  e->set_value("v");
  Response r;
  grpc::ClientContext context;
  ASSERT_TRUE(stub_->ShouldRateLimit(&context, request, &r).ok());
  EXPECT_EQ(r.overall_code(), Response::OVER_LIMIT);

  // An invalid file is refused and the rules in force stay.
  std::ofstream(dir_ + "/edge.yaml") << "domain: edge\ndescriptors:\n  - key: k\n    oops: 1\n";
  kill(pid_, SIGHUP);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(CodeOf("remote_address", "203.0.113.1"), Response::OVER_LIMIT);
  EXPECT_NE(ReadAll(dir_ + "/stderr.log").find("edge.yaml:4: descriptors[0].oops: unknown key"),
            std::string::npos);
  EXPECT_EQ(StopWith(SIGTERM), 0);
}

TEST_F(Serve, ABadEnvoyFileStopsTheStartWithFileLineAndKey) {
  std::ofstream(dir_ + "/edge.yaml")
      << "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute}\n";
  const std::string config = dir_ + "/sluice.yaml";
  const std::string command = std::string(SLUICE_BINARY) + " serve --check --config " + config +
                              " 2>" + dir_ + "/check.log";
  const int status = std::system(command.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(
      ReadAll(dir_ + "/check.log")
          .find("edge.yaml:4: descriptors[0].rate_limit.requests_per_unit: required with unit"),
      std::string::npos)
      << ReadAll(dir_ + "/check.log");
}

}  // namespace
