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

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

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
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
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
  void StartServer() {
    const std::string log = dir_ + "/stderr.log";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    const std::string config = dir_ + "/sluice.yaml";
    const char* argv[] = {SLUICE_BINARY, "serve", "--config", config.c_str(), nullptr};
    ASSERT_EQ(
        posix_spawn(&pid_, SLUICE_BINARY, &actions, nullptr, const_cast<char**>(argv), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    const std::regex started(R"(event=start listener=grpc listen=127\.0\.0\.1:(\d+))");
    for (int i = 0; i < 500; ++i) {
      std::smatch m;
      const std::string text = ReadAll(log);
      if (std::regex_search(text, m, started)) {
        stub_ = rls::RateLimitService::NewStub(
            grpc::CreateChannel("127.0.0.1:" + m[1].str(), grpc::InsecureChannelCredentials()));
        return;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL() << "sluice serve exited: " << text;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL() << "no gRPC listener within 10 s: " << ReadAll(log);
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
