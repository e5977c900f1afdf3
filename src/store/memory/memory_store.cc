#include "sluice/store/memory_store.h"

#include <array>
#include <mutex>
#include <type_traits>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "base/cat.h"
#include "store/memory/compact_key.h"
#include "store/memory/key_budget.h"
#include "store/memory/spin_lock.h"

namespace sluice {

namespace internal {
namespace {

template <typename Config> struct StateOf;
template <> struct StateOf<TokenBucketConfig> { using type = TokenBucketState; };
template <> struct StateOf<GcraConfig> { using type = GcraState; };
template <> struct StateOf<LeakyPoliceConfig> { using type = LeakyPoliceState; };
template <> struct StateOf<LeakyShapeConfig> { using type = LeakyShapeState; };
template <> struct StateOf<FixedWindowConfig> { using type = FixedWindowState; };
template <> struct StateOf<SlidingWindowConfig> { using type = SlidingWindowState; };
template <> struct StateOf<SlidingLogConfig> { using type = SlidingLogState; };

// Decide in place, for the value states and the in-place sliding log alike.
template <typename Config, typename State>
Decision Apply(const Config& config, State& state, Time now, int64_t cost) {
  if constexpr (std::is_same_v<State, SlidingLogState>) {
    return Decide(config, state, now, cost);
  } else {
    const Outcome<State> outcome = Decide(config, state, now, cost);
    state = outcome.state;
    return outcome.decision;
  }
}

// Decide without taking: the value states decide on a copy; the log takes
// and gives back under the same lock (it records at the latest time seen).
template <typename Config, typename State>
Decision CheckOnly(const Config& config, State& state, Time now, int64_t cost) {
  if constexpr (std::is_same_v<State, SlidingLogState>) {
    const Decision d = Decide(config, state, now, cost);
    if (d.allowed && cost > 0) {
      Refund(config, state, Time::FromUnixMicros(state.last_time_us()), cost);
    }
    return d;
  } else {
    return Decide(config, state, now, cost).decision;
  }
}

constexpr int kShardBits = 6;
constexpr int kShards = 1 << kShardBits;

template <typename Config>
class MemoryTable final : public LimitTable, public ReclaimableTable {
 public:
  using State = typename StateOf<Config>::type;

  MemoryTable(LimitConfig config, std::shared_ptr<KeyBudget> budget)
      : limit_config_(std::move(config)),
        config_(std::get<Config>(limit_config_)),
        budget_(std::move(budget)) {
    budget_->Register(this);
  }
  ~MemoryTable() override {
    budget_->Unregister(this);
    int64_t held = 0;
    for (Shard& shard : shards_) held += static_cast<int64_t>(shard.map.size());
    budget_->Removed(held);
  }

  absl::StatusOr<Decision> Decide(std::string_view key, Time now, int64_t cost) override {
    if (absl::Status s = ValidateKey(key); !s.ok()) return s;
    const size_t hash = KeyHash{}(key);
    Shard& shard = ShardFor(hash);
    std::unique_lock lock(shard.lock);
    // The hash is computed once, for the shard and for the lookup.
    if (auto it = shard.map.find(key, hash); it != shard.map.end()) {
      return Apply(config_, it->second, now, cost);
    }
    // A new key: decide on a fresh state, and keep it only if it changed
    // (a denial or a peek leaves nothing behind: a flood of unique keys that
    // are all denied costs no memory).
    State state{};
    const Decision d = Apply(config_, state, now, cost);
    if (!d.allowed || cost == 0) return d;
    if (budget_->Full()) {
      lock.unlock();
      budget_->Reclaim(now);
      lock.lock();
      // Another thread may have created the key meanwhile: decide on its state.
      if (auto it = shard.map.find(key, hash); it != shard.map.end()) {
        return Apply(config_, it->second, now, cost);
      }
    }
    shard.map.emplace(CompactKey(key), std::move(state));
    budget_->Added();
    return d;
  }

  absl::StatusOr<Decision> Check(std::string_view key, Time now, int64_t cost) override {
    if (absl::Status s = ValidateKey(key); !s.ok()) return s;
    Shard& shard = ShardFor(KeyHash{}(key));
    std::lock_guard lock(shard.lock);
    if (auto it = shard.map.find(key); it != shard.map.end()) {
      return CheckOnly(config_, it->second, now, cost);
    }
    State state{};
    return CheckOnly(config_, state, now, cost);
  }

  absl::Status Refund(std::string_view key, Time taken_at, int64_t cost) override {
    if (absl::Status s = ValidateKey(key); !s.ok()) return s;
    Shard& shard = ShardFor(KeyHash{}(key));
    std::lock_guard lock(shard.lock);
    if (auto it = shard.map.find(key); it != shard.map.end()) {
      if constexpr (std::is_same_v<State, SlidingLogState>) {
        sluice::Refund(config_, it->second, taken_at, cost);
      } else {
        it->second = sluice::Refund(config_, it->second, taken_at, cost);
      }
    }
    return absl::OkStatus();
  }

  const LimitConfig& config() const override { return limit_config_; }

  int64_t DropFresh(Time now) override {
    int64_t unused = 0;
    return DropWhere(now, now.unix_micros(), INT64_MAX, unused);
  }

  void SampleFreshAt(std::vector<int64_t>& out, int per_shard) override {
    for (Shard& shard : shards_) {
      std::lock_guard lock(shard.lock);
      int taken = 0;
      for (auto it = shard.map.begin(); it != shard.map.end() && taken < per_shard; ++it, ++taken) {
        out.push_back(FreshAt(config_, it->second).unix_micros());
      }
    }
  }

  int64_t DropFreshBefore(Time now, int64_t threshold_us, int64_t want,
                          int64_t& forced) override {
    return DropWhere(now, threshold_us, want, forced);
  }

 private:
  // The lock has a cache line of its own: waiting on it must not steal the
  // line that holds the map's header from the thread that owns the lock.
  struct alignas(64) Shard {
    SpinLock lock;
    alignas(64) absl::flat_hash_map<CompactKey, State, KeyHash, KeyEq> map;
  };

  Shard& ShardFor(size_t hash) { return shards_[hash >> (64 - kShardBits)]; }

  // Erases keys with FreshAt <= threshold until `want` are gone.
  int64_t DropWhere(Time now, int64_t threshold_us, int64_t want, int64_t& forced) {
    int64_t dropped = 0;
    for (Shard& shard : shards_) {
      if (dropped >= want) break;
      std::lock_guard lock(shard.lock);
      for (auto it = shard.map.begin(); it != shard.map.end() && dropped < want;) {
        const int64_t fresh_at = FreshAt(config_, it->second).unix_micros();
        if (fresh_at <= threshold_us) {
          if (fresh_at > now.unix_micros()) ++forced;
          shard.map.erase(it++);  // erasing leaves other iterators valid
          ++dropped;
        } else {
          ++it;
        }
      }
    }
    budget_->Removed(dropped);
    return dropped;
  }

  const LimitConfig limit_config_;
  const Config& config_;
  const std::shared_ptr<KeyBudget> budget_;
  std::array<Shard, kShards> shards_;
};

}  // namespace
}  // namespace internal

MemoryStore::MemoryStore(MemoryStoreOptions options)
    : options_(options),
      budget_(std::make_shared<internal::KeyBudget>(std::max<int64_t>(1, options.max_keys))) {}

MemoryStore::~MemoryStore() = default;

absl::StatusOr<std::shared_ptr<LimitTable>> MemoryStore::OpenTable(const LimitConfig& config) {
  return std::visit(
      [&](const auto& c) -> std::shared_ptr<LimitTable> {
        using Config = std::decay_t<decltype(c)>;
        return std::make_shared<internal::MemoryTable<Config>>(config, budget_);
      },
      config);
}

MemoryStoreStats MemoryStore::stats() const { return budget_->stats(); }

}  // namespace sluice
