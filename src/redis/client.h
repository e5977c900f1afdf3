// A small non-blocking Redis client for the Redis store: one I/O thread,
// one pipelined connection per node, Redis Cluster routing. Internal.
//
// Requests from any thread are queued and written by the I/O thread in
// batches (pipelining: the commands of concurrent requests share writes
// and round trips). Every request gets exactly one answer, on the I/O
// thread: the reply, or an error within the timeout.
//
// Failure handling, per node:
//  - a broken connection fails its pending requests at once and is
//    reconnected with backoff (25 ms doubling to 400 ms);
//  - a node that answers nothing for `max_timeouts` x `timeout` while a
//    request waits (a hung or paused Redis, a network that drops packets)
//    has its connection closed the same way; a shorter stall only times
//    out the requests it delays;
//  - while a node is not connected, its requests fail at once
//    (Unavailable): a dead Redis costs no latency per request. This is the
//    circuit breaker; a reconnect handshake (AUTH, SELECT, PING, FUNCTION
//    LOAD) is its half-open probe.
//
// Sentinel: the master is the server the sentinels name; asked again when
// its connection is lost and every second while it is up (a failover the
// connection outlived moves to the new master).
//
// Cluster: the slot map comes from CLUSTER SLOTS; keys are routed by the
// CRC16 of their hash tag; -MOVED updates the map and resends, -ASK sends
// ASKING and the command to the named node once; the map is refreshed on
// MOVED, on a lost connection and every second while a slot has no
// reachable master (a failed-over master's replica takes over).
//
// Function libraries given in ClientOptions are loaded on every master's
// connection as it connects (FUNCTION LOAD REPLACE: Redis 7.0 or later); a
// call answered "ERR Function not found" (FUNCTION FLUSH, a restart without
// persistence) is resent behind a new load of them.
//
//   auto client = sluice::redis::Client::Connect({.nodes = {{"127.0.0.1", 6379}}});
//   (*client)->Send(HashSlot("k"), Command({"GET", "k"}),
//                   [](absl::StatusOr<sluice::redis::Reply> r) { ... });
#ifndef SLUICE_REDIS_CLIENT_H_
#define SLUICE_REDIS_CLIENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "redis/resp.h"
#include "sluice/time.h"

struct redisReply;

namespace sluice::redis {

struct Endpoint {
  std::string host;
  uint16_t port = 6379;
  std::string socket_path;  // a Unix socket instead of host and port
  std::string ToString() const;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

// TLS on every connection (Redis' tls-port). The files are read once, by
// Connect; every later connection (a reconnect, a discovered Cluster node)
// uses what was read then.
struct TlsOptions {
  bool enabled = false;
  std::string ca_file;      // PEM; empty: the system's trusted authorities
  std::string cert_file;    // the client's certificate chain (PEM), with key_file
  std::string key_file;     // its private key (PEM)
  std::string server_name;  // the name every node's certificate must carry, and
                            // the SNI sent; empty: the node's own host
};

struct ClientOptions {
  // One node, or a Cluster's seed nodes, or the sentinels of
  // `sentinel_master`.
  std::vector<Endpoint> nodes;
  bool cluster = false;
  // Redis Sentinel: `nodes` are sentinels, and the one server is the
  // master they name (SENTINEL GET-MASTER-ADDR-BY-NAME), asked again after
  // every lost connection and every second; a server that is not a master
  // (ROLE) or answers READONLY is dropped and the sentinels asked again.
  // Not with `cluster`.
  std::string sentinel_master;
  std::string sentinel_user;      // AUTH on the sentinels; empty: "default"
  std::string sentinel_password;  // empty: no AUTH on the sentinels
  std::string user;               // ACL user; empty: "default" (AUTH password)
  std::string password;           // empty: no AUTH
  int database = 0;               // SELECT; not with a Cluster
  TlsOptions tls;
  Duration connect_timeout = Duration::Seconds(1);
  // Per request, from Send to its answer.
  Duration timeout = Duration::Millis(50);
  // Timeouts of silence after which a connection is dropped.
  int max_timeouts = 3;
  // Function libraries: loaded on every master's connection, and again
  // when a call finds its function missing.
  std::vector<std::string> functions;
  // Told, on the I/O thread, when a connection is lost or re-established
  // and when the Cluster's slot map changes: `warning` and one line of
  // key=value pairs ("event=redis_disconnected node=... error=\"...\"").
  std::function<void(bool warning, std::string_view line)> log;
};

// A reply owned by the caller (hiredis' redisReply).
struct ReplyDeleter {
  void operator()(redisReply* reply) const;
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
using ReplyCallback = std::function<void(absl::StatusOr<Reply>)>;

// A command in the Redis protocol (RESP), ready to send (redis/resp.h
// writes them piece by piece).
std::string Command(const std::vector<std::string_view>& args);

// The Cluster slot of a key: CRC16 (XMODEM) of its hash tag (the part
// between the first '{' and the next '}', when not empty) mod 16384.
uint16_t HashSlot(std::string_view key);

struct ClientHealth {
  int nodes = 0;                   // masters known (one without a Cluster)
  int nodes_up = 0;                // connected and past the handshake
  bool all_slots_covered = false;  // every slot has a connected master
  uint64_t requests = 0;
  uint64_t errors = 0;        // answered with an error status
  uint64_t timeouts = 0;      // no answer within the timeout
  uint64_t late_replies = 0;  // replies that came after their timeout
  uint64_t reconnects = 0;
  uint64_t redirects = 0;  // MOVED and ASK followed
  uint64_t topology_refreshes = 0;
  // The one server (not with a Cluster) last connected: "host:port" or
  // "unix:/path"; with Sentinel, the master it named. Empty before any.
  std::string server;
  bool tls = false;
};

class Client {
 public:
  // Connects to every node (and, for a Cluster, discovers the slots and
  // connects to every master) before returning. Errors name the node:
  // unreachable, refused AUTH, not a Cluster node, no slots, a certificate
  // not trusted; or the TLS file that cannot be used.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  ~Client();  // Stop()

  // Answers what is pending with Cancelled (callbacks run on the I/O
  // thread, and may call Send: it answers Cancelled at once), then stops the
  // I/O thread. Idempotent; not from the I/O thread.
  void Stop();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends `command` to the node serving `slot` and calls `done` exactly
  // once on the I/O thread. An error reply is an error status carrying
  // Redis' message (Unknown), except MOVED/ASK and a missing function,
  // handled here. `deadline` (default: now + the timeout) is when the call
  // times out.
  // When `done` was told DeadlineExceeded and the command's reply (not an
  // error) arrives after all, `late` (if set) gets it, on the I/O thread:
  // the command ran. A command whose connection is lost first is unknown.
  void Send(uint16_t slot, std::string command, ReplyCallback done, ReplyCallback late = nullptr,
            std::chrono::steady_clock::time_point deadline = {});

  // Runs `fn` on the I/O thread once `delay` has passed; at Stop at once
  // (a call it sends is then answered Cancelled), and on the caller's
  // thread when the client has stopped already.
  void After(std::chrono::nanoseconds delay, std::function<void()> fn);

  ClientHealth Health() const;
  const ClientOptions& options() const;

  // Reads the TLS files again (a renewed certificate): the connections made
  // from now on use them, those open keep theirs. An error (a file that
  // cannot be used) changes nothing. Nothing to do without TLS: a
  // connection's transport is chosen at Connect.
  absl::Status ReloadTls(const TlsOptions& tls);

  // The round trip of the last command answered (the handshake's PING
  // first, so it is known once Connect returns); zero before any.
  std::chrono::microseconds RoundTrip() const;

  // The I/O thread's id (the blocking forms of the store refuse to wait on it).
  bool OnIoThread() const;

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_CLIENT_H_
