#include "sluice/store/redis_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"

#include "base/cat.h"
#include "redis/client.h"
#include "store/redis/lanes.h"
#include "store/redis/script.h"

namespace sluice {

using internal::Append;
using internal::Cat;

namespace {

// The client's TLS settings: store.redis.tls, on when it or the URL says.
redis::TlsOptions ClientTls(const RedisTls& tls, bool url_says_tls) {
  return {.enabled = url_says_tls || tls.enabled,
          .ca_file = tls.ca_file,
          .cert_file = tls.cert_file,
          .key_file = tls.key_file,
          .server_name = tls.server_name};
}

absl::StatusOr<redis::Endpoint> ParseEndpoint(std::string_view text, std::string_view what) {
  absl::StatusOr<RedisUrl> url = ParseRedisUrl(Cat("redis://", text));
  if (!url.ok()) {
    return absl::InvalidArgumentError(Cat(what, " \"", text, "\": ", url.status().message()));
  }
  if (!url->user.empty() || !url->password.empty() || url->database != 0) {
    return absl::InvalidArgumentError(Cat(what, " \"", text, "\": only host:port"));
  }
  return redis::Endpoint{url->host, url->port, {}};
}

}  // namespace

// ---------------------------------------------------------------------------

namespace {

// A leased table's limit, as its slices need it (docs/distributed.md,
// "Leased limits").
struct LeaseLimit {
  std::string params;  // LimitParams
  int64_t limit = 0;   // fixed_window: the limit; gcra, token_bucket: the burst
  Duration period;
  LeaseOptions options;
  // A request costing more is decided in Redis.
  int64_t max_cost = 0;
  // gcra and token_bucket: a slice is a run of slots (BucketSlice).
  bool bucket = false;
  int64_t per_us = 1;     // ticks a microsecond
  int64_t per_token = 1;  // ticks a unit: the emission interval T
  int64_t cap = 0;        // capacity ticks: burst x per_token
  // How long a slice is sized to last: an eighth of the burst tolerance,
  // within [1 ms, 100 ms]; fixed_window: 100 ms.
  Duration horizon = Duration::Millis(100);
};

LeaseLimit MakeLeaseLimit(const LimitConfig& config, std::string params,
                          const LeaseOptions& options) {
  LeaseLimit l{.params = std::move(params),
               .limit = RateOf(config).limit,
               .period = RateOf(config).period,
               .options = options,
               .max_cost = RateOf(config).limit};
  const BucketConfig* bucket = nullptr;
  if (const auto* c = std::get_if<GcraConfig>(&config)) bucket = c;
  if (const auto* c = std::get_if<TokenBucketConfig>(&config)) bucket = c;
  if (bucket != nullptr) {
    l.bucket = true;
    l.limit = bucket->burst();
    // Half the burst at most: a slice's lead and its slots must fit in it.
    l.max_cost = std::max<int64_t>(1, bucket->burst() / 2);
    l.per_us = bucket->bucket_rate().ticks_per_us;
    l.per_token = bucket->bucket_rate().ticks_per_token;
    l.cap = bucket->capacity_ticks();
    const int64_t tolerance_us = (l.cap - l.per_token) / l.per_us;
    l.horizon = Duration::Micros(std::clamp<int64_t>(tolerance_us / 8, 1000, 100'000));
  }
  return l;
}

// What makes two limits of one policy distinct in their keys, readable in
// redis-cli: ":gcra:100/1s:20" (":token_bucket:40/1s:40",
// ":fixed_window:300/1m").
std::string KeySuffix(const LimitConfig& config) {
  const Rate& rate = RateOf(config);
  std::string suffix = Cat(":", AlgorithmName(AlgorithmOf(config)), ":", rate.limit, "/",
                           FormatDuration(rate.period));
  std::visit(
      [&](const auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_base_of_v<BucketConfig, C>) suffix += Cat(":", c.burst());
        if constexpr (std::is_same_v<C, LeakyShapeConfig>) {
          suffix += Cat(":shape:", FormatDuration(c.max_delay()), ":", c.queue());
        }
        // Named slots ("time cost slot" entries), whose cost builds before
        // them cannot read (their refunds fail on one): a key of their own.
        if constexpr (std::is_same_v<C, ConcurrencyConfig>) suffix += ":named";
      },
      config);
  return suffix;
}

// The Redis key of `key` in the table of policy `name` (keys of one user
// key share a hash tag, so one call decides them on a Cluster).
std::string KeyOf(std::string_view prefix, std::string_view name, std::string_view key,
                  std::string_view suffix) {
  std::string out;
  out.reserve(prefix.size() + name.size() + key.size() + suffix.size() + 3);
  Append(out, prefix, "{", name, ":", key, "}", suffix);
  return out;
}

class RedisTable final : public LimitTable {
 public:
  RedisTable(RedisStore& store, const redis::Client& client, LimitConfig config, std::string name)
      : store_(store),
        client_(client),
        config_(std::move(config)),
        name_(std::move(name)),
        params_(redis::LimitParams(config_, store.options().window_state == WindowState::kInteger)),
        suffix_(KeySuffix(config_)) {}

  absl::StatusOr<Decision> Decide(std::string_view key, Time now, int64_t cost) override {
    return One(key, BatchOp::kDecide, now, cost, Time(), 0);
  }
  absl::StatusOr<Decision> Hold(std::string_view key, Time now, int64_t cost,
                                uint64_t slot) override {
    return One(key, BatchOp::kDecide, now, cost, Time(), slot);
  }
  absl::StatusOr<Decision> Check(std::string_view key, Time now, int64_t cost) override {
    return One(key, BatchOp::kCheck, now, cost, Time(), 0);
  }
  absl::Status Refund(std::string_view key, Time taken_at, int64_t cost, uint64_t slot) override {
    return One(key, BatchOp::kRefund, taken_at, cost, taken_at, slot).status();
  }
  absl::StatusOr<Decision> Renew(std::string_view key, Time taken_at, Time now, int64_t cost,
                                 uint64_t slot) override {
    return One(key, BatchOp::kRenew, now, cost, taken_at, slot);
  }
  absl::Status Charge(std::string_view key, Time now, int64_t cost) override {
    if (!Charges(config_)) return LimitTable::Charge(key, now, cost);
    return One(key, BatchOp::kCharge, now, cost, Time(), 0).status();
  }
  const LimitConfig& config() const override { return config_; }

  const std::string& name() const { return name_; }
  const std::string& suffix() const { return suffix_; }
  const std::string& params() const { return params_; }
  // Set when the table is leased.
  const std::shared_ptr<const LeaseLimit>& lease() const { return lease_; }
  void set_lease(const LeaseOptions& options) {
    lease_ = std::make_shared<const LeaseLimit>(MakeLeaseLimit(config_, params_, options));
  }

 private:
  absl::StatusOr<Decision> One(std::string_view key, BatchOp op, Time now, int64_t cost,
                               Time taken_at, uint64_t slot);

  RedisStore& store_;
  const redis::Client& client_;
  LimitConfig config_;
  std::string name_;
  std::string params_;
  std::string suffix_;
  std::shared_ptr<const LeaseLimit> lease_;
};

}  // namespace

namespace {

// Denials that stay certain (docs/distributed.md, "Denials that cost no
// call"). When Redis answers a batch "denied, retry after T" for cost c,
// the same batch on the same key with a cost of at least c is denied until
// T has passed: other callers can only take more from the key meanwhile,
// and time cannot refill it sooner. So, until then, this process answers
// such a request itself, with Redis' answer brought forward in time.
//
// T is counted from when the call was sent, which is no later than when
// Redis decided: on the steady clock when Redis decides at its own TIME,
// on the caller's clock when it decides at the caller's (use_caller_time).
// Bounded: a shard that fills up is emptied (a lost entry costs one call).
class DenialCache {
 public:
  // The remembered denial of the batch on `keys` (one user key's, in one
  // hash tag `tag`) for `cost` at `now`, if it is still certain.
  std::optional<BatchResult> Find(const std::string& tag, const std::string& keys, int64_t cost,
                                  Time now) {
    Shard& shard = ShardOf(tag);
    std::lock_guard lock(shard.mu);
    auto it = shard.tags.find(tag);
    if (it == shard.tags.end()) return std::nullopt;
    std::vector<Entry>& entries = it->second;
    std::optional<BatchResult> out;
    for (size_t i = 0; i < entries.size();) {
      const Entry& e = entries[i];
      if (now >= e.until) {  // the wait is over: Redis decides again
        entries[i] = std::move(entries.back());
        entries.pop_back();
        continue;
      }
      if (e.keys == keys && cost >= e.cost) out = BroughtForward(e, now);
      ++i;
    }
    if (entries.empty()) shard.tags.erase(it);
    return out;
  }

  // Changes when a refund of a key in `tag`'s shard is sent: a denial whose
  // call was sent before it may have been answered before the refund ran.
  uint64_t Epoch(const std::string& tag) {
    Shard& shard = ShardOf(tag);
    std::lock_guard lock(shard.mu);
    return shard.epoch;
  }

  // Remembers `result`, Redis' answer to the batch on `keys` for `cost` sent
  // at `sent` in `epoch`, when it is a denial that some wait ends.
  void Remember(const std::string& tag, const std::string& keys, int64_t cost, Time sent,
                uint64_t epoch, const BatchResult& result) {
    Duration wait;
    bool denied = false;
    for (const Decision& d : result.decisions) {
      if (d.allowed) continue;
      if (d.retry_after.IsInfinite()) return;  // never passes: nothing to wait for
      denied = true;
      wait = std::max(wait, d.retry_after);
    }
    if (!denied || cost <= 0 || wait <= Duration::Zero()) return;
    Shard& shard = ShardOf(tag);
    std::lock_guard lock(shard.mu);
    if (shard.epoch != epoch) return;  // a refund came between: not certain
    if (shard.tags.size() >= kMaxPerShard) shard.tags.clear();
    std::vector<Entry>& entries = shard.tags[tag];
    Entry entry{.keys = keys, .cost = cost, .sent = sent, .until = sent + wait, .result = result};
    for (Entry& e : entries) {
      if (e.keys == keys) {
        e = std::move(entry);  // the newest answer
        return;
      }
    }
    entries.push_back(std::move(entry));
  }

  // A refund by this process gives quota back: what was certain may not be.
  void Forget(const std::string& tag) {
    Shard& shard = ShardOf(tag);
    std::lock_guard lock(shard.mu);
    ++shard.epoch;
    shard.tags.erase(tag);
  }

 private:
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxPerShard = 4096;
  struct Entry {
    std::string keys;  // the batch's Redis keys, one per line
    int64_t cost = 0;
    Time sent;
    Time until;
    BatchResult result;
  };
  struct Shard {
    std::mutex mu;
    uint64_t epoch = 0;
    absl::flat_hash_map<std::string, std::vector<Entry>> tags;
  };

  // Redis' answer, `now - sent` later: the waits shortened by that much.
  static BatchResult BroughtForward(const Entry& e, Time now) {
    const Duration elapsed = std::max(Duration::Zero(), now - e.sent);
    BatchResult out = e.result;
    out.store_time = out.store_time + elapsed;
    for (Decision& d : out.decisions) {
      if (!d.allowed) d.retry_after = std::max(Duration::Zero(), d.retry_after - elapsed);
      d.reset_after = std::max(d.retry_after, d.reset_after - elapsed);
    }
    return out;
  }

  Shard& ShardOf(const std::string& tag) { return shards_[absl::HashOf(tag) % kShards]; }
  std::array<Shard, kShards> shards_;
};

// Now on the steady clock, as a Time.
Time SteadyNow() {
  return Time::FromUnixMicros(std::chrono::duration_cast<std::chrono::microseconds>(
                                  std::chrono::steady_clock::now().time_since_epoch())
                                  .count());
}

using SteadyClock = std::chrono::steady_clock;

// One request on its way to Redis: its part of a call, and who waits for it.
struct Pending {
  redis::CallPart part;
  uint16_t slot = 0;
  SteadyClock::time_point deadline;
  BatchCallback done;
  BatchCallback late;
  // Remembered when Redis denies it (DenialCache::Remember), if set.
  DenialCache* denials = nullptr;
  std::string tag;
  std::string id;
  int64_t cost = 0;
  Time sent;
  uint64_t epoch = 0;
};
using Batch = std::vector<std::unique_ptr<Pending>>;

using Lanes = redis::Lanes<Pending>;

// ---- leased limits (docs/distributed.md, "Leased limits") ----
//
// A leased fixed_window key's slice in this process: `units` that one call
// took from the key's window in Redis (a decision of that cost, so Redis
// counted them before any was admitted), spent here one request at a time
// until the window ends. The window's end is counted on the steady clock
// from when the call was sent, which is no later than when Redis decided,
// less kLeaseClockMargin: a slice is never spent after its window ended in
// Redis, so the fleet never admits more than the limit in a window.
struct LeaseWaiter {
  int64_t cost = 0;
  BatchCallback done;
};

// A leased gcra or token_bucket slice: `n` slots, the next n emission times
// of the bucket, reserved in Redis by one op L call (its TAT moved past
// them). With U the bucket's use after the grant and r Redis' time of it,
// slot j (0-based) lies at s_j = r + (U - (n - j) x per_token) / per_us;
// it is spent only within the burst tolerance before it, from s_j - tau =
// r + (U - (n - 1 - j) x per_token - capacity) / per_us on (the first at
// once: Redis grants when it fits) until s_j. On the steady clock: not
// before `recv` (after Redis decided) plus the upper bound of that, not
// after `sent` (before it) plus the lower bound of s_j - r, each with a
// margin for the clocks' rates. So every unit the fleet admits sits on a
// slot of its own that lies within the burst tolerance after it: the
// limit's own bound (docs/distributed.md).
struct BucketSlice {
  Time sent;         // steady: when the call was sent
  Time recv;         // steady: when its answer came
  int64_t end = 0;   // U, rounded down (ticks)
  int64_t top = 0;   // U, rounded up (ticks)
  int64_t n = 0;     // slots
  int64_t next = 0;  // the first slot not spent or passed
};

struct Lease {
  std::shared_ptr<const LeaseLimit> limit;
  int64_t units = 0;         // left in the slice
  int64_t window = -1;       // the window it was taken in (Redis time / period)
  Time valid_until;          // steady: the slice is void from here on
  Time store_taken;          // Redis' time of the last grant: a refund's taken_at
  Time taken_sent;           // steady: when the call of that grant was sent
  Time full_until;           // steady: Redis said the window had nothing left
  int64_t window_left = -1;  // what the window had left after the last call; -1 unknown
  int64_t last_ask = 0;
  bool taking = false;  // a call for a slice is on its way
  std::deque<LeaseWaiter> waiters;
  std::deque<BucketSlice> slices;  // gcra, token_bucket: oldest (earliest slots) first
  Time last_use;                   // steady
  int64_t used = 0;                // units spent since `since` (the auto size)
  Time since;
  int64_t pace = 0;  // units spent in the last whole horizon measured
  Duration rtt;      // the last slice's round trip
};

// A slice of a window ending in T (by Redis) is spent until the steady
// clock says T minus this fraction of the wait, minus a millisecond: room
// for two clocks that run up to 1000 ppm apart.
// A bucket's slot, closer apart, gets 100 us of slack.
constexpr int64_t kLeaseClockPpm = 1000;
constexpr Duration kLeaseClockSlack = Duration::Millis(1);
constexpr Duration kSlotClockSlack = Duration::Micros(100);

// `d` of Redis' clock on the steady clock, at most: shortened by the
// margin. And at least: lengthened by it.
Duration ShortOfRedis(Duration d, Duration slack) {
  const int64_t us = d.micros();
  return Duration::Micros(us - us / 1'000'000 * kLeaseClockPpm -
                          us % 1'000'000 * kLeaseClockPpm / 1'000'000) -
         slack;
}
Duration LongOfRedis(Duration d, Duration slack) {
  const int64_t us = d.micros();
  return Duration::Micros(us + us / 1'000'000 * kLeaseClockPpm +
                          (us % 1'000'000 * kLeaseClockPpm + 999'999) / 1'000'000) +
         slack;
}

Time LeaseValidUntil(Time sent, Duration until_window_end, Duration slack = kLeaseClockSlack) {
  return sent + ShortOfRedis(until_window_end, slack);
}

// Until when (steady) slot j of `s` may be spent.
Time SlotValidUntil(const LeaseLimit& lim, const BucketSlice& s, int64_t j) {
  const int64_t ticks = s.end - (s.n - j) * lim.per_token;
  if (ticks < 0) return Time();  // at or before the grant: gone
  return LeaseValidUntil(s.sent, Duration::Micros(ticks / lim.per_us), kSlotClockSlack);
}

// From when (steady) slot j of `s` may be spent.
Time SlotReadyAt(const LeaseLimit& lim, const BucketSlice& s, int64_t j) {
  const int64_t ticks = s.top - (s.n - 1 - j) * lim.per_token - lim.cap;
  if (ticks <= 0) return Time();  // at once
  return s.recv +
         LongOfRedis(Duration::Micros((ticks + lim.per_us - 1) / lim.per_us), kSlotClockSlack);
}

// The first slot of `s` from s.next on that may still be spent at `now`
// (s.n when none): slots' times grow with j.
int64_t FirstLiveSlot(const LeaseLimit& lim, const BucketSlice& s, Time now) {
  int64_t lo = s.next;
  int64_t hi = s.n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (now < SlotValidUntil(lim, s, mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The slices of one store, by Redis key, in shards.
class LeaseBook {
 public:
  struct Shard {
    std::mutex mu;
    absl::flat_hash_map<std::string, Lease> leases;
  };
  Shard& ShardOf(const std::string& key) { return shards_[absl::HashOf(key) % kShards]; }
  std::array<Shard, 16>& shards() { return shards_; }

 private:
  static constexpr size_t kShards = 16;
  std::array<Shard, kShards> shards_;
};

}  // namespace

struct RedisStore::Impl {
  explicit Impl(RedisStoreOptions o)
      : options(std::move(o)),
        lanes(static_cast<size_t>(options.max_batch),
              std::chrono::microseconds(options.linger.micros()),
              static_cast<size_t>(options.calls_in_flight)) {
    held->store = this;
  }

  // Sends `batch` (of `lane`) as one call; its answer is split among the
  // requests, and the lane's next call is sent.
  void Send(uint32_t lane, Batch batch);
  void Answered(uint32_t lane, const std::shared_ptr<Batch>& batch,
                absl::StatusOr<redis::Reply> reply);

  // Queues `p` (a request, a slice's call or a slice given back) in its
  // lane and sends the lane's next call if one may go now. In a loop's turn
  // (InTurn) `p` is held until the turn ends, and then queued with the
  // others asked in it (SubmitHeld).
  void Submit(std::unique_ptr<Pending> p);
  // The requests asked in loop turns (InTurn), held until their turn ends,
  // in the order asked. Shared with the turns' ends, which may come after
  // the store is gone (`store` null then).
  struct HeldInTurns {
    std::mutex mu;
    Impl* store = nullptr;
    absl::flat_hash_map<LoopTurn*, Batch> by_turn;
  };
  static void SubmitHeld(HeldInTurns& held, LoopTurn* turn);
  // One lane per node; on a Cluster, per slot (one call's keys share a slot).
  uint32_t LaneOf(const Pending& p) const { return options.cluster.empty() ? 0 : p.slot; }
  // Sends what a submission let go now, and sets the linger's Flush.
  void Admitted(uint32_t lane, Batch now_sent, bool flush_later);
  // Answers requests whose deadline passed before they were sent.
  static void Expire(Batch& expired);

  // A leased table's requests (docs/distributed.md, "Leased limits").
  using LimitPtr = std::shared_ptr<const LeaseLimit>;
  // False, leaving `done` alone, for a new key when max_leased_keys keys
  // hold leases already: the caller decides it in Redis.
  bool LeaseDecide(const std::string& key, const LimitPtr& limit, int64_t cost,
                   BatchCallback& done);
  // A fixed_window's refund (a bucket's are dropped by the caller). False
  // when the key holds no lease (decided in Redis, past max_leased_keys, or
  // its lease forgotten): the caller refunds in Redis, where a slice's
  // spent units were counted too.
  bool LeaseRefund(const std::string& key, Time taken_at, int64_t cost);
  // Sends the call for a slice of `ask` units (the lease's `taking` set).
  // `lead`: a bucket's (LeaseLead).
  void SendTake(const std::string& key, const LimitPtr& limit, int64_t ask, Duration lead);
  // The connection's last round trip (redis::Client::RoundTrip).
  Duration KnownRoundTrip() const { return Duration::Micros(client->RoundTrip().count()); }
  void TakeAnswered(const std::string& key, int64_t ask, Time sent, absl::StatusOr<BatchResult> r);
  // Gives `units` taken at `store_taken` back to Redis; `done` (may be
  // null) once Redis answered.
  void GiveBack(const std::string& key, const LeaseLimit& limit, int64_t units, Time store_taken,
                std::function<void()> done);
  // The slices of `shard` unused for their ttl, taken out of it to be given
  // back (at the first request, of any key, 100 ms after the last look);
  // forgets idle keys. Nothing is sent under a shard's lock: a call sent
  // on the I/O thread may answer at once, and its callback lock a shard.
  struct Unused {
    std::string key;
    std::shared_ptr<const LeaseLimit> limit;
    int64_t units = 0;
    Time store_taken;
  };
  void Sweep(LeaseBook::Shard& shard, Time now, std::vector<Unused>& out);
  // Every slice back to Redis, waiting up to the timeout (the destructor).
  void ReturnAll();
  // Units in slices still good now (Health).
  uint64_t LeaseHeld();

  RedisStoreOptions options;
  std::unique_ptr<redis::Client> client;
  DenialCache denials;
  Lanes lanes;
  std::shared_ptr<HeldInTurns> held = std::make_shared<HeldInTurns>();
  LeaseBook leases;
  std::atomic<uint64_t> denials_answered{0};  // calls not made (Health)
  std::atomic<uint64_t> decisions{0};         // requests sent to Redis (Health)
  std::atomic<uint64_t> single_calls{0};      // calls of one request (Health)
  std::atomic<uint64_t> lease_decisions{0};
  std::atomic<uint64_t> lease_slices{0};
  std::atomic<uint64_t> lease_returned{0};
  std::atomic<uint64_t> lease_expired{0};
  std::atomic<int64_t> lease_swept_at{0};  // steady microseconds of the last Sweep
  std::atomic<int64_t> leased_keys{0};     // entries in `leases`
};

namespace {

// The parts of `batch`'s requests, in order.
std::vector<const redis::CallPart*> PartsOf(const Batch& batch) {
  std::vector<const redis::CallPart*> parts;
  parts.reserve(batch.size());
  for (const auto& p : batch) parts.push_back(&p->part);
  return parts;
}

// Each request's result from the reply to the call of `batch`.
std::vector<absl::StatusOr<BatchResult>> Split(const Batch& batch,
                                               absl::StatusOr<redis::Reply> reply) {
  using PartResults = std::vector<absl::StatusOr<redis::ScriptResult>>;
  absl::StatusOr<PartResults> parsed = reply.ok() ? redis::ParseCallReply(**reply, PartsOf(batch))
                                                  : absl::StatusOr<PartResults>(reply.status());
  std::vector<absl::StatusOr<BatchResult>> out;
  out.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!parsed.ok()) {
      out.push_back(parsed.status());
    } else if (!(*parsed)[i].ok()) {
      out.push_back((*parsed)[i].status());
    } else {
      redis::ScriptResult& r = *(*parsed)[i];
      out.push_back(BatchResult{.store_time = r.now, .decisions = std::move(r.decisions)});
    }
  }
  return out;
}

}  // namespace

void RedisStore::Impl::Send(uint32_t lane, Batch batch) {
  SteadyClock::time_point deadline = batch.front()->deadline;
  bool wants_late = false;
  for (const auto& p : batch) {
    deadline = std::min(deadline, p->deadline);
    wants_late = wants_late || p->late != nullptr;
  }
  std::string command = redis::JoinParts(PartsOf(batch));
  const uint16_t slot = batch.front()->slot;
  decisions.fetch_add(batch.size(), std::memory_order_relaxed);
  if (batch.size() == 1) single_calls.fetch_add(1, std::memory_order_relaxed);
  auto shared = std::make_shared<Batch>(std::move(batch));
  redis::ReplyCallback late;
  if (wants_late) {
    // The call ran after its requests were told it timed out: those that
    // asked are told what Redis did.
    late = [shared](absl::StatusOr<redis::Reply> reply) {
      std::vector<absl::StatusOr<BatchResult>> results = Split(*shared, std::move(reply));
      for (size_t i = 0; i < shared->size(); ++i) {
        if ((*shared)[i]->late) std::exchange((*shared)[i]->late, nullptr)(std::move(results[i]));
      }
    };
  }
  client->Send(
      slot, std::move(command),
      [this, lane, shared](absl::StatusOr<redis::Reply> reply) {
        Answered(lane, shared, std::move(reply));
      },
      std::move(late), deadline);
}

void RedisStore::Impl::Answered(uint32_t lane, const std::shared_ptr<Batch>& batch,
                                absl::StatusOr<redis::Reply> reply) {
  // The lane's next call first: Redis works on it while the answers go out.
  Batch expired;
  Batch next = lanes.Next(lane, SteadyClock::now(), expired, batch->size());
  if (!next.empty()) Send(lane, std::move(next));
  Expire(expired);
  std::vector<absl::StatusOr<BatchResult>> results = Split(*batch, std::move(reply));
  for (size_t i = 0; i < batch->size(); ++i) {
    Pending& p = *(*batch)[i];
    if (p.denials != nullptr && results[i].ok()) {
      p.denials->Remember(p.tag, p.id, p.cost, p.sent, p.epoch, *results[i]);
    }
    std::exchange(p.done, nullptr)(std::move(results[i]));
  }
}

namespace {

// Redis' time now, from the last grant: its time then plus what has passed.
Time LeaseStoreTime(const Lease& l, Time now) {
  return l.store_taken + std::max(Duration::Zero(), now - l.taken_sent);
}

BatchResult LeaseAnswer(const Lease& l, Time now, bool allowed, Duration retry_after) {
  Decision d;
  d.allowed = allowed;
  d.limit = l.limit->limit;
  // What this process can still admit from its slice: a lower bound of
  // what the window has left.
  d.remaining = l.units;
  d.retry_after = allowed ? Duration::Zero() : std::max(Duration::Micros(1), retry_after);
  d.reset_after = std::max(d.retry_after, std::max(Duration::Zero(), l.valid_until - now));
  return BatchResult{.store_time = LeaseStoreTime(l, now), .decisions = {d}};
}

// The units the next slice asks for: the configured size, or ("auto") what
// this process spends in a horizon (a tenth of a second for a window), as
// measured over the last whole one and since; at least `at_least`
// (the request waiting for it), at most an eighth of the limit, and at most
// half of what the window had left the last time Redis said (at least 1):
// slices shrink to single units as the window runs out, so the fleet can
// spend all of it.
int64_t LeaseAsk(Lease& l, Time now, int64_t at_least) {
  const LeaseLimit& lim = *l.limit;
  int64_t want = lim.options.size;
  const int64_t elapsed_us = std::max<int64_t>((now - l.since).micros(), 1000);
  const int64_t pace = l.used * lim.horizon.micros() / elapsed_us;
  if (want == 0) want = std::max<int64_t>({1, pace, l.pace});
  if (elapsed_us >= lim.horizon.micros()) {
    l.pace = pace;
    l.used = 0;
    l.since = now;
  }
  want = std::min(want, std::max<int64_t>(1, lim.limit / 8));
  // A window's slices shrink with what it has left; a bucket refills, and
  // its slices queue for the slots as they come (BucketSlice).
  if (!lim.bucket && l.window_left >= 0) {
    want = std::min(want, std::max<int64_t>(1, l.window_left / 2));
  }
  return std::max(want, at_least);
}

// How far ahead of Redis' now a bucket slice of n slots starts (op L):
// slot j lies lead + j x T ahead, and at the pace the slice was sized for
// (n in a horizon) it is spent about j x horizon / n after the grant, so
// the lead is what the last slot needs, (n - 1) x (horizon / n - T). At
// least four times the last round trip and 20 ms: the first slot goes to
// the request that waits for it, when the answer comes, and a slot passed
// on the way is a unit lost (a busy machine's round trips jump). The round
// trip is the key's last slice's; for its first, the connection's last
// call's (`known_rtt`), and only before any, the horizon: a lead is not
// free either, since it also delays, by as much, the moment the bucket's
// last slots may be spent (a burst that drains the bucket quicker than
// the lead is denied its last units). At most the horizon; and leaving
// room in the burst for the n slots. What it skips of an idle bucket is
// lost to the fleet (docs/distributed.md).
constexpr int64_t kMinLeadUs = 20'000;
Duration LeaseLead(const Lease& l, int64_t n, Duration known_rtt) {
  const LeaseLimit& lim = *l.limit;
  if (!lim.bucket) return Duration::Zero();
  const int64_t horizon = lim.horizon.micros();
  const int64_t t_us = lim.per_token / lim.per_us;
  int64_t lead = n > 1 ? (n - 1) * (horizon / n - t_us) : 0;
  // No round trip measured for the key yet (its first slice): the
  // connection's; with none either, the horizon.
  const int64_t rtt = l.rtt > Duration::Zero()       ? l.rtt.micros()
                      : known_rtt > Duration::Zero() ? known_rtt.micros()
                                                     : horizon / 4;
  lead = std::max({lead, 4 * rtt, kMinLeadUs});
  lead = std::min({lead, horizon, (lim.cap - n * lim.per_token) / lim.per_us});
  return Duration::Micros(std::max<int64_t>(lead, 0));
}

// The units `l` can admit at `now`: none once a fixed_window slice's
// window has ended; a bucket's slots not spent and not yet passed. What is
// dropped is added to `expired`.
int64_t LiveUnits(Lease& l, Time now, std::atomic<uint64_t>& expired) {
  const LeaseLimit& lim = *l.limit;
  if (!lim.bucket) {
    if (now >= l.valid_until && l.units > 0) {
      expired.fetch_add(static_cast<uint64_t>(l.units), std::memory_order_relaxed);
      l.units = 0;
    }
    return l.units;
  }
  int64_t units = 0;
  for (BucketSlice& slice : l.slices) {
    const int64_t live = FirstLiveSlot(lim, slice, now);
    if (live > slice.next) {
      expired.fetch_add(static_cast<uint64_t>(live - slice.next), std::memory_order_relaxed);
    }
    slice.next = live;
    units += slice.n - slice.next;
  }
  while (!l.slices.empty() && l.slices.front().next == l.slices.front().n) l.slices.pop_front();
  l.units = units;
  return units;
}

// From when the first `cost` of them may be spent (REQUIRES: LiveUnits(l,
// now) >= cost just now): a bucket's slots lie ahead, a window's are ready.
Time ReadyAt(const Lease& l, int64_t cost) {
  if (!l.limit->bucket) return Time();
  for (const BucketSlice& slice : l.slices) {
    if (cost <= slice.n - slice.next) return SlotReadyAt(*l.limit, slice, slice.next + cost - 1);
    cost -= slice.n - slice.next;
  }
  return Time();
}

// Spends `cost` of them (REQUIRES: LiveUnits(l, now) >= cost and ReadyAt(l,
// cost) <= now just now), a bucket's earliest slots first.
void SpendUnits(Lease& l, int64_t cost) {
  l.units -= cost;
  l.used += cost;
  if (!l.limit->bucket) return;
  for (BucketSlice& slice : l.slices) {
    const int64_t take = std::min(cost, slice.n - slice.next);
    slice.next += take;
    cost -= take;
    if (cost == 0) break;
  }
  while (!l.slices.empty() && l.slices.front().next == l.slices.front().n) l.slices.pop_front();
}

}  // namespace

bool RedisStore::Impl::LeaseDecide(const std::string& key, const LimitPtr& limit, int64_t cost,
                                   BatchCallback& done) {
  const Time now = SteadyNow();
  // Every 100 ms one request looks for slices unused for their ttl.
  int64_t swept = lease_swept_at.load(std::memory_order_relaxed);
  if (now.unix_micros() - swept >= 100'000 &&
      lease_swept_at.compare_exchange_strong(swept, now.unix_micros())) {
    std::vector<Unused> unused;
    for (LeaseBook::Shard& s : leases.shards()) {
      std::lock_guard lock(s.mu);
      Sweep(s, now, unused);
    }
    for (Unused& u : unused) GiveBack(u.key, *u.limit, u.units, u.store_taken, nullptr);
  }
  LeaseBook::Shard& shard = leases.ShardOf(key);
  std::unique_lock lock(shard.mu);
  auto it = shard.leases.find(key);
  if (it == shard.leases.end()) {
    if (leased_keys.load(std::memory_order_relaxed) >= options.max_leased_keys) return false;
    leased_keys.fetch_add(1, std::memory_order_relaxed);
    it = shard.leases.try_emplace(key).first;
    it->second.limit = limit;
    it->second.since = now;
  }
  Lease& l = it->second;
  l.last_use = now;
  if (now >= l.valid_until) {  // the slice's window has ended, its slots passed (or none)
    LiveUnits(l, now, lease_expired);
    l.window_left = -1;
  }
  if (l.waiters.empty() && LiveUnits(l, now, lease_expired) >= cost && ReadyAt(l, cost) > now) {
    // This process holds the bucket's next slots, not yet due: Redis
    // would deny too.
    BatchResult answer = LeaseAnswer(l, now, false, ReadyAt(l, cost) - now);
    lock.unlock();
    lease_decisions.fetch_add(1, std::memory_order_relaxed);
    std::exchange(done, nullptr)(std::move(answer));
    return true;
  }
  if (l.waiters.empty() && l.units >= cost) {
    SpendUnits(l, cost);
    BatchResult answer = LeaseAnswer(l, now, true, Duration::Zero());
    // The next slice before this one runs out.
    int64_t ask = 0;
    Duration lead;
    if (!l.taking && l.units * 2 < std::max<int64_t>(l.last_ask, 2) && now >= l.full_until) {
      ask = LeaseAsk(l, now, 1);
      lead = LeaseLead(l, ask, KnownRoundTrip());
      l.taking = true;
      l.last_ask = ask;
    }
    lock.unlock();
    lease_decisions.fetch_add(1, std::memory_order_relaxed);
    if (ask > 0) SendTake(key, limit, ask, lead);
    std::exchange(done, nullptr)(std::move(answer));
    return true;
  }
  if (now < l.full_until) {  // Redis said the window is full until its end
    BatchResult answer = LeaseAnswer(l, now, false, l.full_until - now);
    lock.unlock();
    lease_decisions.fetch_add(1, std::memory_order_relaxed);
    std::exchange(done, nullptr)(std::move(answer));
    return true;
  }
  l.waiters.push_back({cost, std::exchange(done, nullptr)});
  if (l.taking) return true;
  const int64_t ask = LeaseAsk(l, now, cost);
  const Duration lead = LeaseLead(l, ask, KnownRoundTrip());
  l.taking = true;
  l.last_ask = ask;
  lock.unlock();
  SendTake(key, limit, ask, lead);
  return true;
}

void RedisStore::Impl::SendTake(const std::string& key, const LimitPtr& limit, int64_t ask,
                                Duration lead) {
  auto p = std::make_unique<Pending>();
  const std::string_view keys[] = {key};
  const std::string_view limits[] = {limit->params};
  p->part = redis::EncodePart(
      limit->bucket ? redis::ScriptArgs{.op = redis::ScriptOp::kLease, .cost = ask, .lead = lead}
                    : redis::ScriptArgs{.op = redis::ScriptOp::kDecide, .cost = ask},
      keys, limits);
  p->slot = redis::HashSlot(key);
  p->deadline = SteadyClock::now() + std::chrono::microseconds(options.timeout.micros());
  const Time sent = SteadyNow();
  p->done = [this, key, ask, sent](absl::StatusOr<BatchResult> r) {
    TakeAnswered(key, ask, sent, std::move(r));
  };
  Submit(std::move(p));
}

void RedisStore::Impl::TakeAnswered(const std::string& key, int64_t ask, Time sent,
                                    absl::StatusOr<BatchResult> r) {
  const Time now = SteadyNow();
  std::vector<std::pair<BatchCallback, absl::StatusOr<BatchResult>>> answers;
  std::shared_ptr<const LeaseLimit> limit;
  int64_t next_ask = 0;
  Duration next_lead;
  {
    LeaseBook::Shard& shard = leases.ShardOf(key);
    std::lock_guard lock(shard.mu);
    Lease& l = shard.leases[key];
    limit = l.limit;
    l.taking = false;
    l.rtt = now - sent;
    if (limit == nullptr) return;  // cannot happen: the key was there when it asked
    if (!r.ok() || r->decisions.size() != 1) {
      // Redis did not answer: the waiting requests get the error (and the
      // policy's on_store_error); the slice left, if any, stays good.
      const absl::Status error =
          r.ok() ? absl::InternalError("redis: wrong number of decisions") : r.status();
      for (LeaseWaiter& w : l.waiters) answers.emplace_back(std::move(w.done), error);
      l.waiters.clear();
    } else {
      const Decision& d = r->decisions.front();
      l.window_left = std::max<int64_t>(0, d.remaining);
      if (d.allowed && limit->bucket) {
        // reset_after is the last slot's end from Redis' now, rounded up to
        // a microsecond: one less is a bound from below.
        const BucketSlice slice{
            .sent = sent,
            .recv = now,
            .end = std::max<int64_t>(0, d.reset_after.micros() - 1) * limit->per_us,
            .top = d.reset_after.micros() * limit->per_us,
            .n = ask};
        l.slices.push_back(slice);
        l.valid_until = SlotValidUntil(*limit, slice, ask - 1);
      } else if (d.allowed) {
        const int64_t window = r->store_time.unix_micros() / limit->period.micros();
        if (window != l.window || now >= l.valid_until) {  // a new window's slice
          lease_expired.fetch_add(static_cast<uint64_t>(l.units), std::memory_order_relaxed);
          l.units = 0;
        }
        l.units += ask;
        l.window = window;
        l.valid_until = LeaseValidUntil(sent, d.reset_after);
      } else if (limit->bucket && !d.retry_after.IsInfinite()) {
        // No slot fits until the bucket drains to one: the wait Redis said
        // (less a microsecond of rounding), from when the call was sent.
        const int64_t one_us = d.retry_after.micros() - 1;
        if (one_us > 0) l.full_until = sent + Duration::Micros(one_us);
      } else if (!limit->bucket && d.remaining <= 0) {
        // Nothing left in the window until it ends: denied here until then.
        l.full_until = sent + d.retry_after;
      }
      if (d.allowed) {
        l.store_taken = r->store_time;
        l.taken_sent = sent;
        l.full_until = Time();
        lease_slices.fetch_add(1, std::memory_order_relaxed);
      }
      // The waiting requests, in order, from the slice; those whose slots
      // are not yet due are denied until they are.
      while (!l.waiters.empty() && LiveUnits(l, now, lease_expired) >= l.waiters.front().cost) {
        if (const Time ready = ReadyAt(l, l.waiters.front().cost); ready > now) {
          for (LeaseWaiter& w : l.waiters) {
            answers.emplace_back(std::move(w.done), LeaseAnswer(l, now, false, ready - now));
            lease_decisions.fetch_add(1, std::memory_order_relaxed);
          }
          l.waiters.clear();
          break;
        }
        LeaseWaiter& w = l.waiters.front();
        SpendUnits(l, w.cost);
        answers.emplace_back(std::move(w.done), LeaseAnswer(l, now, true, Duration::Zero()));
        l.waiters.pop_front();
        lease_decisions.fetch_add(1, std::memory_order_relaxed);
      }
      if (!l.waiters.empty()) {
        const int64_t front = l.waiters.front().cost;
        if (now < l.full_until || (d.remaining < front && !d.allowed)) {
          // The window cannot fit them: denied until it ends.
          const Duration wait =
              now < l.full_until ? l.full_until - now : std::max(Duration::Zero(), d.retry_after);
          for (LeaseWaiter& w : l.waiters) {
            answers.emplace_back(std::move(w.done), LeaseAnswer(l, now, false, wait));
            lease_decisions.fetch_add(1, std::memory_order_relaxed);
          }
          l.waiters.clear();
        } else {
          next_ask = LeaseAsk(l, now, front);
          if (!d.allowed) next_ask = std::min(next_ask, std::max(front, d.remaining));
          next_lead = LeaseLead(l, next_ask, KnownRoundTrip());
          l.taking = true;
          l.last_ask = next_ask;
        }
      }
    }
  }
  if (next_ask > 0) SendTake(key, limit, next_ask, next_lead);
  for (auto& [done, answer] : answers) done(std::move(answer));
}

bool RedisStore::Impl::LeaseRefund(const std::string& key, Time taken_at, int64_t cost) {
  LeaseBook::Shard& shard = leases.ShardOf(key);
  std::lock_guard lock(shard.mu);
  auto it = shard.leases.find(key);
  if (it == shard.leases.end()) return false;
  Lease& l = it->second;
  if (cost <= 0) return true;
  // Back into the slice it came from, while that window lasts; a window
  // that has ended needs nothing back.
  if (SteadyNow() < l.valid_until &&
      taken_at.unix_micros() / l.limit->period.micros() == l.window) {
    l.units += cost;
  }
  return true;
}

void RedisStore::Impl::GiveBack(const std::string& key, const LeaseLimit& limit, int64_t units,
                                Time store_taken, std::function<void()> done) {
  auto p = std::make_unique<Pending>();
  const std::string_view keys[] = {key};
  const std::string_view limits[] = {limit.params};
  p->part = redis::EncodePart(
      {.op = redis::ScriptOp::kRefund, .cost = units, .taken_at = store_taken}, keys, limits);
  p->slot = redis::HashSlot(key);
  p->deadline = SteadyClock::now() + std::chrono::microseconds(options.timeout.micros());
  p->done = [this, units, done = std::move(done)](absl::StatusOr<BatchResult> r) {
    if (r.ok()) lease_returned.fetch_add(units, std::memory_order_relaxed);
    if (done) done();
  };
  Submit(std::move(p));
}

void RedisStore::Impl::Sweep(LeaseBook::Shard& shard, Time now, std::vector<Unused>& out) {
  for (auto it = shard.leases.begin(); it != shard.leases.end();) {
    Lease& l = it->second;
    const bool idle = !l.taking && l.waiters.empty() && now - l.last_use >= l.limit->options.ttl;
    // A bucket's slots are not given back (docs/distributed.md): they pass.
    if (idle && !l.limit->bucket && l.units > 0 && now < l.valid_until) {
      out.push_back({it->first, l.limit, l.units, l.store_taken});
      l.units = 0;
    }
    if (idle && now >= l.full_until) {
      // A bucket's slots held still pass unspent.
      const int64_t held = LiveUnits(l, now, lease_expired);
      lease_expired.fetch_add(static_cast<uint64_t>(held), std::memory_order_relaxed);
      shard.leases.erase(it++);  // forgotten: the next request asks again
      leased_keys.fetch_sub(1, std::memory_order_relaxed);
    } else {
      ++it;
    }
  }
}

uint64_t RedisStore::Impl::LeaseHeld() {
  const Time now = SteadyNow();
  uint64_t held = 0;
  for (LeaseBook::Shard& shard : leases.shards()) {
    std::lock_guard lock(shard.mu);
    for (auto& [key, l] : shard.leases)
      held += static_cast<uint64_t>(LiveUnits(l, now, lease_expired));
  }
  return held;
}

void RedisStore::Impl::ReturnAll() {
  // Shared with the callbacks: one may come after the wait gave up.
  struct Count {
    std::mutex mu;
    std::condition_variable cv;
    int outstanding = 0;
  };
  auto count = std::make_shared<Count>();
  const Time now = SteadyNow();
  std::vector<Unused> unused;
  for (LeaseBook::Shard& shard : leases.shards()) {
    std::lock_guard lock(shard.mu);
    for (auto& [key, l] : shard.leases) {
      if (l.limit->bucket || l.units <= 0 || now >= l.valid_until) continue;
      unused.push_back({key, l.limit, l.units, l.store_taken});
      l.units = 0;
    }
  }
  count->outstanding = static_cast<int>(unused.size());
  for (Unused& u : unused) {
    GiveBack(u.key, *u.limit, u.units, u.store_taken, [count] {
      std::lock_guard c(count->mu);
      if (--count->outstanding == 0) count->cv.notify_all();
    });
  }
  std::unique_lock wait(count->mu);
  count->cv.wait_for(wait, std::chrono::microseconds(options.timeout.micros()) * 2,
                     [&] { return count->outstanding == 0; });
}

absl::StatusOr<std::unique_ptr<RedisStore>> RedisStore::Connect(RedisStoreOptions options,
                                                                EventLog log) {
  if (!options.url.empty() + !options.cluster.empty() + !options.sentinel.nodes.empty() != 1) {
    return absl::InvalidArgumentError("redis: give exactly one of url, cluster and sentinel");
  }
  if (!options.sentinel.nodes.empty() && options.sentinel.master.empty()) {
    return absl::InvalidArgumentError("redis sentinel: name the master the sentinels monitor");
  }
  if (options.key_prefix.find_first_of("{}") != std::string::npos) {
    return absl::InvalidArgumentError(
        Cat("redis key_prefix \"", options.key_prefix, "\": no '{' or '}' (they set hash tags)"));
  }
  if (options.timeout <= Duration::Zero() || options.connect_timeout <= Duration::Zero()) {
    return absl::InvalidArgumentError("redis: timeouts must be positive");
  }
  redis::ClientOptions client;
  if (!options.url.empty()) {
    absl::StatusOr<RedisUrl> url = ParseRedisUrl(options.url);
    if (!url.ok()) return url.status();
    client.nodes.push_back({.host = url->host, .port = url->port, .socket_path = url->socket_path});
    client.user = url->user;
    client.password = url->password;
    client.database = url->database;
    client.tls.enabled = url->tls;
  } else {
    client.cluster = !options.cluster.empty();
    client.sentinel_master = options.sentinel.master;
    client.sentinel_user = options.sentinel.user;
    client.sentinel_password = options.sentinel.password;
    for (const std::string& node : client.cluster ? options.cluster : options.sentinel.nodes) {
      absl::StatusOr<redis::Endpoint> ep =
          ParseEndpoint(node, client.cluster ? "redis cluster node" : "redis sentinel");
      if (!ep.ok()) return ep.status();
      client.nodes.push_back(*ep);
    }
  }
  if (!options.user.empty()) client.user = options.user;
  if (!options.password.empty()) client.password = options.password;
  if (options.database != 0) client.database = options.database;
  client.tls = ClientTls(options.tls, client.tls.enabled);
  client.timeout = options.timeout;
  client.connect_timeout = options.connect_timeout;
  client.functions.push_back(std::string(redis::FunctionLibrary()));
  client.log = std::move(log);
  absl::StatusOr<std::unique_ptr<redis::Client>> connected = redis::Client::Connect(client);
  if (!connected.ok()) return connected.status();
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->client = *std::move(connected);
  return std::unique_ptr<RedisStore>(new RedisStore(std::move(impl)));
}

RedisStore::RedisStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
// The client stops while the whole store is alive: a callback answered by
// the stop may call the store again (it is answered Cancelled).
RedisStore::~RedisStore() {
  // Requests still held in a turn are answered, as those in flight and
  // those waiting for them are (Cancelled, by the stopped client).
  absl::flat_hash_map<LoopTurn*, Batch> held;
  {
    std::lock_guard lock(impl_->held->mu);
    impl_->held->store = nullptr;
    held.swap(impl_->held->by_turn);
  }
  for (auto& [turn, asked] : held) {
    for (auto& p : asked)
      std::exchange(p->done, nullptr)(absl::CancelledError("redis store stopped"));
  }
  impl_->ReturnAll();
  impl_->client->Stop();
}

const RedisStoreOptions& RedisStore::options() const { return impl_->options; }

absl::Status RedisStore::ReloadTls(const RedisTls& tls) {
  // (The client does nothing when it was started without TLS.)
  return impl_->client->ReloadTls(ClientTls(tls, /*url_says_tls=*/true));
}

absl::StatusOr<std::shared_ptr<LimitTable>> RedisStore::OpenTable(const LimitConfig& config) {
  return OpenNamedTable(config, "");
}

absl::StatusOr<std::shared_ptr<LimitTable>> RedisStore::OpenNamedTable(const LimitConfig& config,
                                                                       std::string_view name) {
  if (absl::Status s = redis::ValidateForRedis(config); !s.ok()) return s;
  return std::make_shared<RedisTable>(*this, *impl_->client, config, std::string(name));
}

absl::StatusOr<std::shared_ptr<LimitTable>> RedisStore::OpenLeasedTable(const LimitConfig& config,
                                                                        std::string_view name,
                                                                        const LeaseOptions& lease) {
  if (absl::Status s = ValidateLease(config, lease); !s.ok()) {
    return absl::InvalidArgumentError(Cat("lease: ", s.message()));
  }
  if (impl_->options.use_caller_time) {
    return absl::InvalidArgumentError("lease: needs Redis' own clock (not use_caller_time)");
  }
  absl::StatusOr<std::shared_ptr<LimitTable>> table = OpenNamedTable(config, name);
  if (!table.ok()) return table;
  static_cast<RedisTable&>(**table).set_lease(lease);
  return table;
}

void RedisStore::ClaimQuota(std::string_view bucket, std::string_view instance, int64_t want,
                            int64_t floor, int64_t limit, Duration ttl,
                            std::function<void(absl::StatusOr<QuotaClaim>)> done) {
  const std::string key = Cat(impl_->options.key_prefix, "rlqs:{", bucket, "}");
  const std::string name = Cat(redis::FunctionName(), "_quota");
  const std::string args[] = {std::to_string(want), std::to_string(floor), std::to_string(limit),
                              std::to_string(std::max<int64_t>(1, ttl.micros()))};
  std::string command =
      redis::Command({"FCALL", name, "1", key, instance, args[0], args[1], args[2], args[3]});
  impl_->client->Send(
      redis::HashSlot(key), std::move(command),
      [done = std::move(done)](absl::StatusOr<redis::Reply> reply) {
        if (!reply.ok()) return done(reply.status());
        const redisReply& r = **reply;
        if (r.type != REDIS_REPLY_ARRAY || r.elements != 3 ||
            r.element[0]->type != REDIS_REPLY_INTEGER ||
            r.element[1]->type != REDIS_REPLY_INTEGER ||
            r.element[2]->type != REDIS_REPLY_INTEGER) {
          return done(absl::InternalError("redis: a quota claim answered in the wrong shape"));
        }
        done(QuotaClaim{.claim = r.element[0]->integer,
                        .target = r.element[1]->integer,
                        .store_time = Time::FromUnixMicros(r.element[2]->integer)});
      });
}

std::string RedisStore::RedisKey(const LimitTable& table, std::string_view key) const {
  const auto& t = static_cast<const RedisTable&>(table);
  return KeyOf(impl_->options.key_prefix, t.name(), key, t.suffix());
}

void RedisStore::DecideBatch(std::span<LimitTable* const> tables, std::string_view key, BatchOp op,
                             Time now, int64_t cost, Time taken_at, uint64_t slot,
                             BatchCallback done, BatchCallback late) {
  if (absl::Status s = ValidateKey(key); !s.ok()) return done(s);
  if (tables.empty()) return done(BatchResult{.store_time = now, .decisions = {}});
  if (tables.size() == 1) {
    const auto* table = static_cast<const RedisTable*>(tables.front());
    const std::shared_ptr<const LeaseLimit>& lease = table->lease();
    // A leased limit decides from its slice; a check (nothing taken) and a
    // request that could never pass ask Redis as usual.
    if (lease != nullptr && !impl_->options.use_caller_time) {
      if (op == BatchOp::kDecide && cost > 0 && cost <= lease->max_cost &&
          impl_->LeaseDecide(RedisKey(*table, key), lease, cost, done)) {
        return;
      }
      // A leased bucket's refunds are dropped, even of what Redis decided:
      // lowering its TAT would hand out slots that slices still hold.
      if (op == BatchOp::kRefund &&
          (lease->bucket || impl_->LeaseRefund(RedisKey(*table, key), taken_at, cost))) {
        return done(BatchResult{.store_time = taken_at, .decisions = {}});
      }
    }
  }
  redis::ScriptArgs args{.op = op == BatchOp::kDecide   ? redis::ScriptOp::kDecide
                               : op == BatchOp::kCheck  ? redis::ScriptOp::kCheck
                               : op == BatchOp::kRenew  ? redis::ScriptOp::kRenew
                               : op == BatchOp::kCharge ? redis::ScriptOp::kCharge
                                                        : redis::ScriptOp::kRefund,
                         .cost = cost,
                         .taken_at = taken_at,
                         .slot = slot};
  if (impl_->options.use_caller_time) args.now = now;
  auto p = std::make_unique<Pending>();
  // Most policies have one or two limits: no allocation for these.
  absl::InlinedVector<std::string, 2> keys;
  absl::InlinedVector<std::string_view, 2> key_views;
  absl::InlinedVector<std::string_view, 2> limits;
  for (LimitTable* table : tables) {
    keys.push_back(RedisKey(*table, key));
    limits.push_back(static_cast<RedisTable*>(table)->params());
  }
  for (const std::string& k : keys) key_views.push_back(k);
  // A denial Redis gave for this batch that still stands answers at once;
  // a refund makes the key's denials uncertain. (Every key of a batch has
  // the same hash tag: one user key.)
  // A concurrency limit's denial is never certain: a release frees a slot
  // before the wait Redis gave.
  const bool certain = std::none_of(tables.begin(), tables.end(),
                                    [](const LimitTable* t) { return IsConcurrency(t->config()); });
  if (impl_->options.cache_denials) {
    std::string tag = keys.front().substr(0, keys.front().find('}') + 1);
    if (op == BatchOp::kRefund || op == BatchOp::kRenew) {
      impl_->denials.Forget(tag);
    } else if (certain && (op == BatchOp::kDecide || op == BatchOp::kCheck)) {
      for (const std::string& k : keys) p->id.append(k).push_back('\n');
      p->sent = impl_->options.use_caller_time ? now : SteadyNow();
      p->epoch = impl_->denials.Epoch(tag);
      if (std::optional<BatchResult> known = impl_->denials.Find(tag, p->id, cost, p->sent)) {
        impl_->denials_answered.fetch_add(1, std::memory_order_relaxed);
        return done(*std::move(known));
      }
      p->denials = &impl_->denials;
      p->tag = std::move(tag);
      p->cost = cost;
    }
  }
  p->part = redis::EncodePart(args, key_views, limits);
  p->slot = redis::HashSlot(keys.front());
  p->deadline = SteadyClock::now() + std::chrono::microseconds(impl_->options.timeout.micros());
  p->done = std::move(done);
  p->late = std::move(late);
  impl_->Submit(std::move(p));
}

void RedisStore::Impl::Submit(std::unique_ptr<Pending> p) {
  if (LoopTurn* turn = InTurn::Current(); turn != nullptr && options.max_batch > 1) {
    std::lock_guard lock(held->mu);
    Batch& asked = held->by_turn[turn];
    if (asked.empty()) turn->AtTurnEnd([held = held, turn] { SubmitHeld(*held, turn); });
    asked.push_back(std::move(p));
    return;
  }
  const uint32_t lane = LaneOf(*p);
  bool flush_later = false;
  Batch now_sent = lanes.Submit(lane, std::move(p), &flush_later);
  Admitted(lane, std::move(now_sent), flush_later);
}

void RedisStore::Impl::SubmitHeld(HeldInTurns& held, LoopTurn* turn) {
  // Under the lock: the store is not destroyed meanwhile.
  std::lock_guard lock(held.mu);
  auto it = held.by_turn.find(turn);
  if (held.store == nullptr || it == held.by_turn.end()) return;
  Batch asked = std::move(it->second);
  held.by_turn.erase(it);
  Impl& store = *held.store;
  // One submission per lane, in the order asked.
  for (size_t i = 0; i < asked.size(); ++i) {
    if (asked[i] == nullptr) continue;
    const uint32_t lane = store.LaneOf(*asked[i]);
    Batch group;
    for (size_t j = i; j < asked.size(); ++j) {
      if (asked[j] != nullptr && store.LaneOf(*asked[j]) == lane)
        group.push_back(std::move(asked[j]));
    }
    bool flush_later = false;
    Batch now_sent = store.lanes.Submit(lane, std::move(group), &flush_later);
    store.Admitted(lane, std::move(now_sent), flush_later);
  }
}

void RedisStore::Impl::Admitted(uint32_t lane, Batch now_sent, bool flush_later) {
  if (!now_sent.empty()) Send(lane, std::move(now_sent));
  if (flush_later) {
    client->After(lanes.linger(), [this, lane] {
      Batch expired;
      Batch due = lanes.Flush(lane, SteadyClock::now(), expired);
      if (!due.empty()) Send(lane, std::move(due));
      Expire(expired);
    });
  }
}

void RedisStore::Impl::Expire(Batch& expired) {
  for (auto& p : expired) {
    std::exchange(p->done, nullptr)(
        absl::DeadlineExceededError("redis: no answer within the timeout (waited to be sent)"));
  }
}

std::optional<RedisStore::LeaseView> RedisStore::LeaseOf(const LimitConfig& config,
                                                         std::string_view name,
                                                         std::string_view key) const {
  const std::string redis_key = KeyOf(impl_->options.key_prefix, name, key, KeySuffix(config));
  LeaseBook::Shard& shard = impl_->leases.ShardOf(redis_key);
  std::lock_guard lock(shard.mu);
  auto it = shard.leases.find(redis_key);
  if (it == shard.leases.end()) return std::nullopt;
  Lease& l = it->second;
  const Time now = SteadyNow();
  return LeaseView{.units = LiveUnits(l, now, impl_->lease_expired),
                   .valid_for = std::max(Duration::Zero(), l.valid_until - now),
                   .window_left = now < l.valid_until ? l.window_left : -1,
                   .window_full = now < l.full_until};
}

RedisStoreHealth RedisStore::Health() const {
  const redis::ClientHealth h = impl_->client->Health();
  return {.up = h.all_slots_covered,
          .server = h.server,
          .tls = h.tls,
          .nodes = h.nodes,
          .nodes_up = h.nodes_up,
          .calls = h.requests,
          .errors = h.errors,
          .timeouts = h.timeouts,
          .late_replies = h.late_replies,
          .reconnects = h.reconnects,
          .redirects = h.redirects,
          .topology_refreshes = h.topology_refreshes,
          .denials_answered = impl_->denials_answered.load(std::memory_order_relaxed),
          .decisions = impl_->decisions.load(std::memory_order_relaxed),
          .single_calls = impl_->single_calls.load(std::memory_order_relaxed),
          .lease_decisions = impl_->lease_decisions.load(std::memory_order_relaxed),
          .lease_slices = impl_->lease_slices.load(std::memory_order_relaxed),
          .lease_returned = impl_->lease_returned.load(std::memory_order_relaxed),
          .lease_expired = impl_->lease_expired.load(std::memory_order_relaxed),
          .lease_held = impl_->LeaseHeld()};
}

namespace {

absl::StatusOr<Decision> RedisTable::One(std::string_view key, BatchOp op, Time now, int64_t cost,
                                         Time taken_at, uint64_t slot) {
  if (client_.OnIoThread()) {
    return absl::FailedPreconditionError(
        "redis: a blocking call on the store's own I/O thread would wait for itself");
  }
  std::promise<absl::StatusOr<BatchResult>> promise;
  std::future<absl::StatusOr<BatchResult>> future = promise.get_future();
  LimitTable* self = this;
  store_.DecideBatch(
      std::span<LimitTable* const>(&self, 1), key, op, now, cost, taken_at, slot,
      [&promise](absl::StatusOr<BatchResult> r) { promise.set_value(std::move(r)); });
  absl::StatusOr<BatchResult> r = future.get();
  if (!r.ok()) return r.status();
  if (op == BatchOp::kRefund || op == BatchOp::kCharge) return Decision{};
  if (r->decisions.size() != 1) return absl::InternalError("redis: wrong number of decisions");
  return r->decisions.front();
}

}  // namespace

}  // namespace sluice
