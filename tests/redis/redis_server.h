// A redis-server of the test's own: started on a free loopback port, stopped
// by its PID when the object goes away. The child is set to die with the
// thread that started it, so a test that crashes leaves no server behind.
//
// The server runs with no persistence (`--save "" --appendonly no`), bound
// to 127.0.0.1, with `--hz 100` (it stops within 10 ms of SIGTERM; later
// extra_args override any of these). Start() returns once it answers PING. Kill(), Restart(),
// Pause() and Resume() let a test play a crash, a failover's restart on the
// same port, or a server that hangs. Only the child this object started is
// ever signalled.
//
// Thread-safety: one thread drives one RedisServer.
//
//   absl::StatusOr<std::unique_ptr<sluice::test::RedisServer>> server =
//       sluice::test::RedisServer::Start();
//   redisContext* c = redisConnect("127.0.0.1", (*server)->port());
#ifndef SLUICE_TESTS_REDIS_REDIS_SERVER_H_
#define SLUICE_TESTS_REDIS_REDIS_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::test {

struct RedisServerOptions {
  // Found on PATH. Default: redis-server.
  std::string binary = "redis-server";
  // Appended to the command line, e.g. {"--maxmemory", "10mb"}.
  std::vector<std::string> extra_args;
};

class RedisServer {
 public:
  // Errors: Unavailable when the binary cannot be started or does not answer
  // PING within a few seconds (the message says which).
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(RedisServerOptions options = {});

  // Stops the server (SIGTERM, then SIGKILL if it lingers).
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  // 0 while not running.
  pid_t pid() const { return pid_; }

  // SIGKILL: a crash. All data is lost (there is no persistence).
  absl::Status Kill();
  // SIGTERM, then SIGKILL after two seconds.
  absl::Status Stop();
  // Starts a new server on the same port (stopping the running one first).
  absl::Status Restart();
  // SIGSTOP / SIGCONT: the server stops answering, then carries on.
  absl::Status Pause();
  absl::Status Resume();

 private:
  RedisServer(RedisServerOptions options, int port) : options_(std::move(options)), port_(port) {}
  absl::Status Spawn();
  absl::Status WaitUntilReady();
  absl::Status Signal(int signal, int wait_ms);

  RedisServerOptions options_;
  int port_ = 0;
  pid_t pid_ = 0;
};

}  // namespace sluice::test

#endif  // SLUICE_TESTS_REDIS_REDIS_SERVER_H_
