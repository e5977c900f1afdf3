// sluice/store/redis_options.h: how to reach Redis (RedisStoreOptions) and
// the redis:// URL, apart from the Redis store itself so that a config can
// name and check them without a Redis client (sluice/config.h).
#ifndef SLUICE_STORE_REDIS_OPTIONS_H_
#define SLUICE_STORE_REDIS_OPTIONS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/time.h"

namespace sluice {

// How fixed_window and sliding_window limits keep their states in Redis
// (docs/distributed.md, "A window's count in one integer").
enum class WindowState {
  kText,     // "window count", "window prev curr": what every version reads
  kInteger,  // the counts and a tag of their window in one integer, raised
             // by one INCRBY; read only by versions that read both forms
};

// TLS to every Redis node (docs/configuration.md, "TLS to Redis"). The
// files are read when the store connects; the node's certificate must chain
// to a trusted authority and name the node (or server_name).
struct RedisTls {
  bool enabled = false;     // a rediss:// URL turns it on too
  std::string ca_file;      // PEM; empty: the system's trusted authorities
  std::string cert_file;    // the client's certificate chain (PEM), with key_file
  std::string key_file;     // its private key (PEM)
  std::string server_name;  // the name every node's certificate must carry, and
                            // the SNI sent; empty: the node's own host
  friend bool operator==(const RedisTls&, const RedisTls&) = default;
};

// Redis Sentinel (docs/configuration.md, "Redis Sentinel"): the server is
// the master these sentinels name, asked again after every lost connection
// and every second.
struct RedisSentinel {
  std::string master;              // the name the sentinels monitor it by
  std::vector<std::string> nodes;  // some of the sentinels, "host:port"
  std::string user;                // ACL user and password on the sentinels
  std::string password;
  friend bool operator==(const RedisSentinel&, const RedisSentinel&) = default;
};

struct RedisStoreOptions {
  // One server: "redis://[[user]:password@]host[:port][/database]", or
  // "rediss://..." for TLS, or "unix://[[user]:password@]/path[?db=N]".
  std::string url;
  // Or a Redis Cluster: some of its nodes, "host:port" (the rest are
  // discovered).
  std::vector<std::string> cluster;
  // Or the master that sentinels name. Exactly one of `url`, `cluster` and
  // `sentinel.nodes`.
  RedisSentinel sentinel;
  // ACL user and password; when set they override the URL's.
  std::string user;
  std::string password;
  int database = 0;  // SELECT; overrides the URL's when not 0. Not with a Cluster.
  RedisTls tls;
  // Per call, from the request to Redis' answer; then the policy's
  // on_store_error decides.
  Duration timeout = Duration::Millis(50);
  Duration connect_timeout = Duration::Seconds(1);
  // Every key starts with it; no '{' or '}' (they would move the hash tag).
  std::string key_prefix = "sluice:";
  // Decide at Redis' TIME (production) or at the time the caller passes
  // (tests and replays that drive a manual clock).
  bool use_caller_time = false;
  // Answer a request Redis has certainly denied without asking again: after
  // Redis denies a key's request of cost c with "retry after T", requests
  // for that key with a cost of at least c are denied by this process until
  // T has passed. Exact: meanwhile other callers can only take more.
  bool cache_denials = true;
  // Coalescing: while calls_in_flight calls to one Redis node (on a
  // Cluster, one slot) are in flight, the decisions that arrive meanwhile
  // wait and go together in the next call, at most this many in one call,
  // each with its own answer; while another call is in flight, a call
  // carries at most a calls_in_flight + 1-th of the decisions going round
  // (docs/distributed.md, "A call's share"). A decision alone is sent at
  // once. 1: one decision per call.
  int max_batch = 64;
  // Calls to one Redis node (one slot) in flight at once, 1 to 16. Fewer
  // make larger calls under load, and so less of Redis' time per decision;
  // more send a waiting decision sooner at moderate load.
  int calls_in_flight = 2;
  // The linger: right after a call of several decisions was answered, a
  // decision that finds no call waiting to be answered waits up to this
  // long for as many others as that call carried (those whose answers it
  // brought tend to come back), instead of going alone. Zero: never wait.
  Duration linger = Duration::Micros(100);
  // Leased limits: at most this many keys hold a lease in this process at
  // once (a key's lease is forgotten once it has been idle for its ttl). A
  // new key beyond it is decided by Redis call by call, as without a lease:
  // a flood of new keys costs calls, never unbounded memory.
  int64_t max_leased_keys = 65'536;
  // The form window limits write their states in. Every instance sharing
  // the Redis must read the integer form before any writes it: instances
  // built before it (2026-12-05) read only text, so a fleet that still runs
  // them sets kText until all are upgraded.
  WindowState window_state = WindowState::kInteger;

  friend bool operator==(const RedisStoreOptions&, const RedisStoreOptions&) = default;
};

// A redis:// (or rediss://, TLS; or unix://, a Unix socket) URL's parts.
// ParseRedisUrl's errors name the part that is wrong.
struct RedisUrl {
  bool tls = false;         // rediss://
  std::string socket_path;  // unix://[[user]:password@]/path[?db=N]: a Unix socket
  std::string host;
  uint16_t port = 6379;
  std::string user;
  std::string password;
  int database = 0;
};
absl::StatusOr<RedisUrl> ParseRedisUrl(std::string_view url);

}  // namespace sluice

#endif  // SLUICE_STORE_REDIS_OPTIONS_H_
