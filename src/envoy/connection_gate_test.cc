// The gate of grpc.listen by itself (connection_gate.h): what it hands
// gRPC, what it refuses, what it closes. The calls through it are
// rls_server_test.cc's.
#include "envoy/connection_gate.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::envoy {
namespace {

class GateTest : public ::testing::Test {
 protected:
  void Start(int64_t max_connections, Duration handshake_timeout) {
    absl::StatusOr<std::unique_ptr<ConnectionGate>> gate = ConnectionGate::Listen(
        HostPort{.host = "127.0.0.1", .port = 0},
        {.max_connections = max_connections, .handshake_timeout = handshake_timeout}, metrics_);
    ASSERT_TRUE(gate.ok()) << gate.status();
    gate_ = *std::move(gate);
    gate_->Start([this](int fd) {
      std::lock_guard lock(mu_);
      handed_.push_back(fd);
      cv_.notify_all();
    });
  }
  void TearDown() override {
    if (gate_ != nullptr) gate_->Stop();
    for (int fd : handed_) close(fd);
    for (int fd : clients_) close(fd);
  }

  int Connect() {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(gate_->port());
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    clients_.push_back(fd);
    return fd;
  }

  // The descriptor the gate handed over for the `n`th connection (1-based),
  // or -1 when none came within 5 s.
  int Handed(size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(5), [&] { return handed_.size() >= n; });
    return handed_.size() >= n ? handed_[n - 1] : -1;
  }

  // Whether the gate closed `fd`'s connection within 5 s (the client reads
  // its end or a reset).
  static bool ClosedByPeer(int fd) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&p, 1, 5000) != 1) return false;
    char c;
    return recv(fd, &c, 1, 0) <= 0;
  }

  metrics::Metrics metrics_;
  std::unique_ptr<ConnectionGate> gate_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> handed_;  // guarded by mu_
  std::vector<int> clients_;
};

TEST_F(GateTest, HandsOverAConnectionWithNagleOff) {
  // gRPC sets TCP_NODELAY on the connections it accepts itself, not on a
  // descriptor it is given: without it, a small answer may wait for the
  // client's delayed ACK.
  Start(10, Duration::Seconds(5));
  const int client = Connect();
  ASSERT_EQ(send(client, "P", 1, 0), 1);  // its first bytes
  const int fd = Handed(1);
  ASSERT_GE(fd, 0);
  int nodelay = 0;
  socklen_t length = sizeof(nodelay);
  ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &length), 0);
  EXPECT_EQ(nodelay, 1);
  char c = 0;
  EXPECT_EQ(recv(fd, &c, 1, 0), 1);  // what the client sent is still there for gRPC
  EXPECT_EQ(c, 'P');
}

TEST_F(GateTest, RefusesBeyondItsCapAndClosesTheSilent) {
  Start(2, Duration::Millis(300));
  const int talking = Connect();
  ASSERT_EQ(send(talking, "P", 1, 0), 1);
  ASSERT_GE(Handed(1), 0);
  const int silent = Connect();  // the second slot, until its deadline
  const int refused = Connect();
  EXPECT_TRUE(ClosedByPeer(refused));
  EXPECT_EQ(metrics_.Get("sluice_grpc_connections_refused_total", {})->value(), 1);
  EXPECT_TRUE(ClosedByPeer(silent));
  EXPECT_EQ(metrics_.Get("sluice_grpc_handshake_timeouts_total", {})->value(), 1);
  std::lock_guard lock(mu_);
  EXPECT_EQ(handed_.size(), 1u);
}

}  // namespace
}  // namespace sluice::envoy
