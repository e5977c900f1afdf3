#include "redis/redis_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace sluice::test {
namespace {

using Clock = std::chrono::steady_clock;

// Binds `port` (0: any) on loopback and returns the port bound, or 0.
int BindPort(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof addr;
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  return bound ? ntohs(addr.sin_port) : 0;
}

// A port nobody listens on now: bind port 0 and read back what the kernel
// chose. Another process could take it before redis-server binds it; Start
// retries with a new port when the server fails to come up. A Cluster node
// also listens on port + 10000 (its bus), which must exist and be free.
absl::StatusOr<int> FreePort(bool cluster_bus) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = BindPort(0);
    if (port == 0)
      return absl::UnavailableError(std::string("binding a free port: ") + std::strerror(errno));
    if (!cluster_bus || (port + 10000 <= 65535 && BindPort(port + 10000) != 0)) return port;
  }
  return absl::UnavailableError("found no free port with a free Cluster bus port");
}

bool Pong(int port) {
  timeval timeout{0, 200'000};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeout);
  if (c == nullptr) return false;
  bool pong = false;
  if (c->err == 0 && redisSetTimeout(c, timeout) == REDIS_OK) {
    auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
    pong = reply != nullptr && reply->type == REDIS_REPLY_STATUS &&
           std::string(reply->str, reply->len) == "PONG";
    if (reply != nullptr) freeReplyObject(reply);
  }
  redisFree(c);
  return pong;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(RedisServerOptions options) {
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const bool cluster = std::find(options.extra_args.begin(), options.extra_args.end(),
                                   "--cluster-enabled") != options.extra_args.end();
    absl::StatusOr<int> port = FreePort(cluster);
    if (!port.ok()) return port.status();
    std::unique_ptr<RedisServer> server(new RedisServer(options, *port));
    last = server->Spawn();
    if (last.ok()) last = server->WaitUntilReady();
    if (last.ok()) return server;
  }
  return last;
}

RedisServer::~RedisServer() { (void)Stop(); }

absl::Status RedisServer::Spawn() {
  // Resolved here, not in the child: between fork and exec only
  // async-signal-safe calls are allowed, and a PATH search may allocate.
  std::string path = options_.binary;
  if (path.find('/') == std::string::npos) {
    const char* env_path = std::getenv("PATH");
    std::string dirs = env_path != nullptr ? env_path : "/usr/bin:/bin";
    path.clear();
    for (size_t start = 0; start <= dirs.size();) {
      size_t end = dirs.find(':', start);
      if (end == std::string::npos) end = dirs.size();
      const std::string candidate = dirs.substr(start, end - start) + "/" + options_.binary;
      if (access(candidate.c_str(), X_OK) == 0) {
        path = candidate;
        break;
      }
      start = end + 1;
    }
    if (path.empty()) {
      return absl::UnavailableError(options_.binary + " is not on PATH (install redis-server)");
    }
  }
  const std::string port = std::to_string(port_);
  // --hz 100: the server acts on SIGTERM in its 1/hz cron, so a test's
  // server stops in 10 ms instead of 100 (and expires keys more eagerly).
  std::vector<std::string> args = {path, "--port",       port, "--bind", "127.0.0.1", "--save",
                                   "",   "--appendonly", "no", "--hz",   "100"};
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::UnavailableError(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The server dies with the test even when the test crashes before its
    // destructor runs: no redis-server outlives the process that owns it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    // Its log would interleave with the test's output.
    const int null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
    }
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  pid_ = pid;
  return absl::OkStatus();
}

absl::Status RedisServer::WaitUntilReady() {
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      return absl::UnavailableError("redis-server on port " + std::to_string(port_) +
                                    " exited at start (status " + std::to_string(status) +
                                    "): is it installed, is the port taken?");
    }
    if (Pong(port_)) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (void)Signal(SIGKILL, 2000);
  return absl::UnavailableError("redis-server on port " + std::to_string(port_) +
                                " did not answer PING within 5 s");
}

// Sends `signal` to the child and waits up to `wait_ms` for it to exit
// (SIGKILL if it has not). wait_ms < 0: do not wait (SIGSTOP, SIGCONT).
absl::Status RedisServer::Signal(int signal, int wait_ms) {
  if (pid_ == 0) return absl::FailedPreconditionError("redis-server is not running");
  if (kill(pid_, signal) != 0) {
    return absl::InternalError(std::string("kill: ") + std::strerror(errno));
  }
  if (wait_ms < 0) return absl::OkStatus();
  // A stopped process does not act on SIGTERM until it runs again.
  if (signal == SIGTERM) kill(pid_, SIGCONT);
  const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_ || (done < 0 && errno == ECHILD)) break;
    if (Clock::now() >= deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = 0;
  return absl::OkStatus();
}

absl::Status RedisServer::Kill() { return Signal(SIGKILL, 2000); }

absl::Status RedisServer::Stop() {
  if (pid_ == 0) return absl::OkStatus();
  return Signal(SIGTERM, 2000);
}

absl::Status RedisServer::Restart() {
  if (absl::Status s = Stop(); !s.ok()) return s;
  // The old listener is gone once the process is reaped; redis-server sets
  // SO_REUSEADDR, so the port is free again at once.
  if (absl::Status s = Spawn(); !s.ok()) return s;
  return WaitUntilReady();
}

absl::Status RedisServer::Pause() { return Signal(SIGSTOP, -1); }
absl::Status RedisServer::Resume() { return Signal(SIGCONT, -1); }

}  // namespace sluice::test
