// sluice/store/redis_store.h: limits shared by a fleet, in Redis or a Redis
// Cluster.
//
// Every decision is ONE call of one Redis function (FCALL; Redis 7.0 or
// later) that runs the limit's algorithm inside Redis, atomically, at
// Redis' own clock (TIME):
// instances with skewed clocks agree, and two instances can never both
// spend the last token. The limits of one key in one policy share a hash
// tag, so they sit in one Cluster slot and one call decides them all,
// all-or-nothing. Keys expire when their state is fresh again.
//
// Decisions are asynchronous (DecideBatch; Limiter::AcquireAsync): calls from
// concurrent requests are pipelined on one connection per Redis node by an
// I/O thread of the store's, and requests that arrive while two calls to a
// node are in flight are coalesced into the next call, each decided in
// order with its own answer. Each call has a timeout; a node that is down
// fails its calls at once until it is back (a circuit breaker), and the
// store reconnects by itself. docs/distributed.md has the details.
//
// A leased limit (OpenLeasedTable) is decided in this process against a
// slice of it that one call reserved in Redis; unused slices go back when
// the key goes quiet and when the store is destroyed.
//
// Thread-safety: every method from any thread. The blocking LimitTable
// methods (Decide, Check, Refund) must not be called from the store's own
// I/O thread (a DecideBatch callback): they would wait for themselves.
//
//   absl::StatusOr<std::unique_ptr<sluice::RedisStore>> redis =
//       sluice::RedisStore::Connect({.url = "redis://127.0.0.1:6379"});
//   sluice::MemoryStore local;
//   auto limiter = sluice::Limiter::Create(local, {
//       .name = "login",
//       .limits = {{.algorithm = sluice::Algorithm::kTokenBucket, .rate =
//       *sluice::ParseRate("40/s")},
//                  {.algorithm = sluice::Algorithm::kSlidingWindow, .rate =
//                  *sluice::ParseRate("300/min")}},
//       .stores = {nullptr, redis->get()},  // the second limit is fleet-wide
//       .on_store_error = sluice::OnStoreError::kLocal});
#ifndef SLUICE_STORE_REDIS_STORE_H_
#define SLUICE_STORE_REDIS_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/store/redis_options.h"
#include "sluice/store/store.h"
#include "sluice/time.h"

namespace sluice {

// What the store's connections are doing, for /readyz and metrics.
struct RedisStoreHealth {
  bool up = false;  // every slot (the one server) reachable now
  // The one server last connected ("host:port", "unix:/path"; with
  // Sentinel, the master it named); empty with a Cluster.
  std::string server;
  bool tls = false;
  int nodes = 0;
  int nodes_up = 0;
  uint64_t calls = 0;
  uint64_t errors = 0;
  uint64_t timeouts = 0;
  uint64_t late_replies = 0;  // replies to calls that had timed out (used, see DecideBatch)
  uint64_t reconnects = 0;
  uint64_t redirects = 0;
  uint64_t topology_refreshes = 0;
  // Decisions answered by this process from a denial Redis gave that still
  // stood (RedisStoreOptions::cache_denials): calls not made.
  uint64_t denials_answered = 0;
  // Requests sent to Redis; `calls` carried them (several in one call when
  // they were coalesced: RedisStoreOptions::max_batch).
  uint64_t decisions = 0;
  // Calls that carried a single request: under load, a large share of
  // `calls` means coalescing found nothing to join them to.
  uint64_t single_calls = 0;
  // Leased limits (OpenLeasedTable): decisions answered from a slice in
  // this process, slices Redis granted, and units given back unused.
  uint64_t lease_decisions = 0;
  uint64_t lease_slices = 0;
  uint64_t lease_returned = 0;
  // Units of slices that were never spent nor given back: a window's left
  // when it ended, a bucket's slots whose time passed (or held by a key
  // forgotten as idle). Lost to the fleet: the under-admission.
  uint64_t lease_expired = 0;
  // Units held in this process's slices now, unspent (quota the rest of the
  // fleet cannot use until they are spent, given back or expire).
  uint64_t lease_held = 0;
};

class RedisStore final : public Store {
 public:
  // Connects (and, for a Cluster, discovers every master) before returning;
  // loads the function library. Errors say what failed where: an unreachable node, a
  // refused password, a node that is not in Cluster mode.
  // `log`, when given, is told (on the store's I/O thread) when a
  // connection is lost or re-established and when the Cluster's slot map
  // changes: `warning`, and one line of key=value pairs.
  using EventLog = std::function<void(bool warning, std::string_view line)>;
  static absl::StatusOr<std::unique_ptr<RedisStore>> Connect(RedisStoreOptions options,
                                                             EventLog log = nullptr);
  ~RedisStore() override;

  // Rejects limits that the function cannot compute exactly (InvalidArgument).
  absl::StatusOr<std::shared_ptr<LimitTable>> OpenTable(const LimitConfig& config) override;
  absl::StatusOr<std::shared_ptr<LimitTable>> OpenNamedTable(const LimitConfig& config,
                                                             std::string_view name) override;
  // fixed_window only (docs/distributed.md, "Leased limits"); the other
  // algorithms answer InvalidArgument.
  // The claim lives in the hash `<key_prefix>rlqs:{<bucket>}`, one field
  // per instance (lua/quota.lua).
  void ClaimQuota(std::string_view bucket, std::string_view instance, int64_t want, int64_t floor,
                  int64_t limit, Duration ttl,
                  std::function<void(absl::StatusOr<QuotaClaim>)> done) override;
  absl::StatusOr<std::shared_ptr<LimitTable>> OpenLeasedTable(const LimitConfig& config,
                                                              std::string_view name,
                                                              const LeaseOptions& lease) override;
  bool remote() const override { return true; }
  void DecideBatch(std::span<LimitTable* const> tables, std::string_view key, BatchOp op, Time now,
                   int64_t cost, Time taken_at, uint64_t slot, BatchCallback done,
                   BatchCallback late = nullptr) override;

  RedisStoreHealth Health() const;

  // Reads store.redis.tls's files again (a renewed certificate, on a
  // reload): connections made from now on use them, open ones keep theirs.
  // An error (a file that cannot be used) changes nothing. Without TLS at
  // Connect, nothing to do.
  absl::Status ReloadTls(const RedisTls& tls);
  const RedisStoreOptions& options() const;

  // The Redis key of `key` in a table opened with `name` (tests, tools).
  std::string RedisKey(const LimitTable& table, std::string_view key) const;

  // What this process holds of a leased limit's key (GET /v1/keys): the
  // units left in its slice, how long the slice stays good, what the window
  // had left at the last call (-1 unknown), and whether Redis said the
  // window is full. Nothing when the process holds no lease of the key.
  struct LeaseView {
    int64_t units = 0;
    Duration valid_for;
    int64_t window_left = -1;
    bool window_full = false;
  };
  std::optional<LeaseView> LeaseOf(const LimitConfig& config, std::string_view name,
                                   std::string_view key) const;

  struct Impl;

 private:
  explicit RedisStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice

#endif  // SLUICE_STORE_REDIS_STORE_H_
