// The gate of grpc.listen by itself (connection_gate.h): what it hands
// gRPC, what it refuses, what it closes. The calls through it are
// rls_server_test.cc's.
#include "envoy/connection_gate.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <openssl/ssl.h>

#include "envoy/grpc_test_support.h"
#include "gtest/gtest.h"
#include "tls/context.h"

namespace sluice::envoy {
namespace {

class GateTest : public ::testing::Test {
 protected:
  // With `tls`, on `relay_threads`; `echo`: each handed descriptor is
  // answered by a thread that sends back what it reads (gRPC's part), until
  // its end of the stream.
  void Start(int64_t max_connections, Duration handshake_timeout,
             std::shared_ptr<tls::Context> tls = nullptr, int relay_threads = 1,
             bool echo = false) {
    signal(SIGPIPE, SIG_IGN);  // a write to a connection the gate ended fails, as sluice's
    absl::StatusOr<std::unique_ptr<ConnectionGate>> gate =
        ConnectionGate::Listen(HostPort{.host = "127.0.0.1", .port = 0},
                               {.max_connections = max_connections,
                                .handshake_timeout = handshake_timeout,
                                .tls = std::move(tls),
                                .relay_threads = relay_threads},
                               metrics_);
    ASSERT_TRUE(gate.ok()) << gate.status();
    gate_ = *std::move(gate);
    gate_->Start([this, echo](int fd) {
      std::lock_guard lock(mu_);
      if (echo) {
        echoes_.emplace_back([fd] {
          fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // handed over non-blocking
          char buffer[4096];
          for (;;) {
            const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
            if (n <= 0 || send(fd, buffer, static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
          }
          close(fd);
        });
      } else {
        handed_.push_back(fd);
      }
      cv_.notify_all();
    });
  }
  void TearDown() override {
    if (gate_ != nullptr) gate_->Stop();  // the relays end: so do the echoes
    for (std::thread& t : echoes_) t.join();
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

  // The gauge of open connections, once it is `expected` (within 5 s).
  int64_t OpenConnections(int64_t expected) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (;;) {
      const std::string text = metrics_.Render();
      const size_t at = text.find("\nsluice_grpc_connections ");
      const int64_t open = at == std::string::npos ? -1 : std::stoll(text.substr(at + 25));
      if (open == expected || std::chrono::steady_clock::now() > deadline) return open;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  metrics::Metrics metrics_;
  std::unique_ptr<ConnectionGate> gate_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> handed_;          // guarded by mu_
  std::vector<std::thread> echoes_;  // guarded by mu_
  std::vector<int> clients_;
};

// A client of the gate over TLS (HTTP/2 by ALPN, as gRPC's), verifying the
// server's certificate for "localhost" against `ca_file`.
class TlsClient {
 public:
  TlsClient(uint16_t port, const std::string& ca_file) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    SSL_CTX_load_verify_locations(ctx_, ca_file.c_str(), nullptr);
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
    static const unsigned char kAlpn[] = {2, 'h', '2'};
    SSL_CTX_set_alpn_protos(ctx_, kAlpn, sizeof(kAlpn));
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const timeval five{.tv_sec = 5, .tv_usec = 0};  // no read waits forever
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof(five));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    SSL_set1_host(ssl_, "localhost");
    SSL_set_tlsext_host_name(ssl_, "localhost");
    ok_ = connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0 && SSL_connect(ssl_) == 1;
  }
  ~TlsClient() {
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
    close(fd_);
  }
  bool ok() const { return ok_; }
  // Sends `text` and reads as many bytes back; what came back.
  std::string RoundTrip(const std::string& text) {
    if (SSL_write(ssl_, text.data(), static_cast<int>(text.size())) !=
        static_cast<int>(text.size()))
      return "(not sent)";
    std::string back(text.size(), '\0');
    size_t got = 0;
    while (got < back.size()) {
      const int n = SSL_read(ssl_, back.data() + got, static_cast<int>(back.size() - got));
      if (n <= 0) return "(ended after " + back.substr(0, got) + ")";
      got += static_cast<size_t>(n);
    }
    return back;
  }
  // Whether the connection ended (close_notify, EOF or reset) within 5 s.
  bool Ended() {
    char c;
    const int n = SSL_read(ssl_, &c, 1);
    return n <= 0 && SSL_get_error(ssl_, n) != SSL_ERROR_WANT_READ;  // not the read's timeout
  }

 private:
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool ok_ = false;
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

// grpc.tls's context of `certs`' server certificate (null, with the
// failure reported, when there is none).
std::shared_ptr<tls::Context> ServerContext(const TestCertificates& certs) {
  EXPECT_TRUE(certs.ok()) << "the openssl command makes the test certificates";
  absl::StatusOr<std::shared_ptr<tls::Context>> context = tls::ServerContext(
      {.cert_file = certs.Path("server", "pem"), .key_file = certs.Path("server", "key")},
      "grpc.tls", tls::Protocol::kHttp2);
  EXPECT_TRUE(context.ok()) << context.status();
  return context.ok() ? *context : nullptr;
}

TEST_F(GateTest, RelaysTlsOnEveryThreadUntilItStops) {
  const TestCertificates certs;
  std::shared_ptr<tls::Context> context = ServerContext(certs);
  ASSERT_NE(context, nullptr);
  Start(100, Duration::Seconds(10), context, /*relay_threads=*/3, /*echo=*/true);
  EXPECT_EQ(ThreadsNamed("sluice-grpc-tls"), 3);
  // Nine connections at once, three on each thread, each many messages
  // both ways, some longer than a TLS record.
  std::vector<std::unique_ptr<TlsClient>> clients;
  for (int i = 0; i < 9; ++i) {
    clients.push_back(std::make_unique<TlsClient>(gate_->port(), certs.Path("ca", "pem")));
    ASSERT_TRUE(clients.back()->ok()) << i;
  }
  EXPECT_EQ(OpenConnections(9), 9);
  std::atomic<int> echoed{0};
  std::vector<std::thread> talking;
  for (int i = 0; i < 9; ++i) {
    talking.emplace_back([&, i] {
      for (int j = 0; j < 30; ++j) {
        const std::string text =
            std::string(j % 10 == 9 ? 40'000 : 20, static_cast<char>('a' + i)) + std::to_string(j);
        echoed += clients[static_cast<size_t>(i)]->RoundTrip(text) == text;
      }
    });
  }
  for (std::thread& t : talking) t.join();
  EXPECT_EQ(echoed.load(), 9 * 30);
  // A client that leaves: its slot is free again.
  clients.pop_back();
  EXPECT_EQ(OpenConnections(8), 8);
  gate_->Stop();  // every relay ends, and says so to its client
  for (const auto& client : clients) EXPECT_TRUE(client->Ended());
  EXPECT_EQ(OpenConnections(0), 0);
}

TEST_F(GateTest, CloseEndsTheHandshakesNotDoneAndKeepsTheRelays) {
  const TestCertificates certs;
  std::shared_ptr<tls::Context> context = ServerContext(certs);
  ASSERT_NE(context, nullptr);
  Start(100, Duration::Seconds(10), context, /*relay_threads=*/2, /*echo=*/true);
  TlsClient relayed(gate_->port(), certs.Path("ca", "pem"));
  ASSERT_TRUE(relayed.ok());
  // Half a ClientHello, on each relay thread: their handshakes wait.
  std::vector<int> halves;
  for (int i = 0; i < 2; ++i) {
    halves.push_back(Connect());
    ASSERT_EQ(send(halves.back(), "\x16\x03\x01\x02\x00\x01", 6, 0), 6);
  }
  EXPECT_EQ(OpenConnections(3), 3);
  gate_->Close();  // the listener goes, and with it what is not handed over yet
  for (int fd : halves) EXPECT_TRUE(ClosedByPeer(fd));
  EXPECT_EQ(relayed.RoundTrip("still here"), "still here");
  EXPECT_EQ(OpenConnections(1), 1);
}

}  // namespace
}  // namespace sluice::envoy
