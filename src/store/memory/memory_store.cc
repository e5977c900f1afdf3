#include "sluice/store/memory_store.h"

#include <array>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <optional>
#include <string_view>
#include <type_traits>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "base/cat.h"
#include "store/memory/compact_key.h"
#include "store/memory/decided_as.h"
#include "store/memory/key_budget.h"
#include "store/memory/log_cell.h"
#include "store/memory/packed_window.h"
#include "store/memory/read_gate.h"
#include "store/memory/remembered.h"
#include "store/memory/shard_map.h"

namespace sluice {

namespace internal {
namespace {

constexpr int kShardBits = 6;
constexpr int kShards = 1 << kShardBits;
static_assert(kShards == ReclaimableTable::kShards);

// kPacked: a fixed or sliding window's states packed in one word each
// (packed_window.h, `packing` from PackingOf).
template <typename Config, bool kPacked = false>
class MemoryTable final : public LimitTable, public ReclaimableTable {
 public:
  using State = StateOf_t<Config>;
  // The sliding log's cell answers certain denials without its lock
  // (log_cell.h); every other state is a StateCell (read_gate.h), a packed
  // window's of its word.
  static constexpr bool kLog = std::is_same_v<Config, SlidingLogConfig>;
  // A concurrency limit: its slots are named (Hold).
  static constexpr bool kNamed = std::is_same_v<Config, ConcurrencyConfig>;
  using Cell =
      std::conditional_t<kLog, LogCell, StateCell<std::conditional_t<kPacked, uint64_t, State>>>;
  // Whether StateUntil gives back the very state (the bucket algorithms):
  // evicting such a key loses nothing when it is remembered.
  static constexpr bool kRememberedWhole =
      std::is_same_v<Config, GcraConfig> || std::is_same_v<Config, PoliceAsGcra> ||
      std::is_same_v<Config, LeakyShapeConfig>;  // (a token bucket's table is gcra's)

  // `config` is what config() reports; `decided` decides (the same limit,
  // or, for a token bucket or a policing leaky bucket, the gcra of its rate
  // and burst: decided_as.h).
  MemoryTable(LimitConfig config, const Config& decided, std::shared_ptr<KeyBudget> budget,
              std::shared_ptr<RememberedKeys> remembered, uint64_t salt, WindowPacking packing = {})
      : packing_(packing),
        limit_config_(std::move(config)),
        config_(decided),
        budget_(std::move(budget)),
        remembered_(std::move(remembered)),
        salt_(salt) {
    budget_->Register(this);
  }
  ~MemoryTable() override {
    budget_->Unregister(this);
    int64_t held = 0;
    for (Shard& shard : shards_) held += static_cast<int64_t>(shard.map.size());
    budget_->Removed(held);
  }

  absl::StatusOr<Decision> Decide(std::string_view key, Time now, int64_t cost) override {
    if (absl::Status s = InRange(now); !s.ok()) return s;
    auto step = [&](State& state) { return DecideInPlace(config_, state, now, cost); };
    auto keep = [cost](const Decision& d) { return d.allowed && cost > 0; };
    if constexpr (kLog) {
      return Write(key, now, step, keep, [&](Cell& cell) {
        return cell.Peek(now.unix_micros(), [&](const LogCell::Summary& summary) {
          return CertainDenial(config_, summary, now, cost);
        });
      });
    } else {
      return Write(key, now, step, keep);
    }
  }

  absl::StatusOr<Decision> Hold(std::string_view key, Time now, int64_t cost,
                                uint64_t slot) override {
    if constexpr (!kNamed) {
      return Decide(key, now, cost);
    } else {
      if (slot == 0) return Decide(key, now, cost);
      if (absl::Status s = InRange(now); !s.ok()) return s;
      return Write(
          key, now, [&](State& state) { return sluice::Hold(config_, state, now, cost, slot); },
          [cost](const Decision& d) { return d.allowed && cost > 0; });
    }
  }

  absl::Status Charge(std::string_view key, Time now, int64_t cost) override {
    if constexpr (!kCharges<Config>) {
      return LimitTable::Charge(key, now, cost);
    } else {
      if (absl::Status s = InRange(now); !s.ok()) return s;
      return Write(
                 key, now,
                 [&](State& state) {
                   ChargeInPlace(config_, state, now, cost);
                   return Decision{};
                 },
                 [cost](const Decision&) { return cost > 0; })
          .status();
    }
  }

 private:
  struct NoPeek {};

  // Runs `step` (Decision(State&)) on the key's state; on a key not held yet,
  // on a fresh state, kept only when `keep(decision)`. A held key's cell is
  // first offered to `peek` (std::optional<Decision>(Cell&)): a decision it
  // returns is the answer, and `step` does not run.
  template <typename Step, typename Keep, typename Peek = NoPeek>
  absl::StatusOr<Decision> Write(std::string_view key, Time now, Step step, Keep keep,
                                 Peek peek = {}) {
    if (absl::Status s = ValidateKey(key); !s.ok()) return s;
    // The hash is computed once, for the shard and for the lookups.
    const size_t hash = KeyHash{}(key);
    Shard& shard = ShardFor(hash);
    std::optional<Decision> shared_small;
    {  // A key the shard holds is decided in its cell; the shard is only read.
      ShardGate::Reader reader(shard.gate);
      if (Cell* cell = shard.map.Find(key, hash)) {
        if constexpr (!std::is_same_v<Peek, NoPeek>) {
          if (std::optional<Decision> d = peek(*cell)) return *d;
        }
        const Decision d = UpdateCell(*cell, step, reader.holding());
        if (reader.holding() == Holding::kAlone || !shard.map.WantsLines(StoreKeys())) [[likely]] {
          return d;
        }
        shared_small = d;
      }
    }
    if (shared_small) {
      // Threads share this small packed shard: its keys move to lines of
      // their own, once (shard_map.h), in a write section after this read.
      ShardGate::Writer writer(shard.gate);
      std::lock_guard lock(writer);
      if (shard.map.WantsLines(StoreKeys())) shard.map.Unpack();
      return *shared_small;
    }
    // A new key: decide on a fresh state (or on what is remembered of it,
    // if it was evicted while not fresh), and keep it only if it changed (a
    // denial or a peek leaves nothing behind: a flood of unique keys that
    // are all denied costs no memory, and takes no write section).
    State state = NewState(hash, now);
    Decision d = step(state);
    if (!keep(d)) return d;
    ShardGate::Writer writer(shard.gate);
    std::unique_lock lock(writer);
    // Another thread may have created the key meanwhile: decide on its state.
    if (Cell* cell = shard.map.Find(key, hash)) return UpdateCell(*cell, step);
    // The slot is reserved before the key goes in, so the store never holds
    // more than max_keys keys, however many threads insert at once.
    KeyBudget::Admission admission = budget_->Reserve();
    if (admission == KeyBudget::Admission::kFull) {
      lock.unlock();
      const bool reserved = budget_->MakeRoom(now);  // bounded: a few slices
      lock.lock();
      // Another thread may have created the key meanwhile: decide on its state.
      if (Cell* cell = shard.map.Find(key, hash)) {
        if (reserved) budget_->Removed(1);
        return UpdateCell(*cell, step);
      }
      if (!reserved) {
        if (!budget_->evicts()) {
          // OnFull::kDenyNew: no room, and nobody's state is given up for it.
          budget_->DeniedNew();
          d.allowed = false;
          d.remaining = 0;
          d.delay = Duration::Zero();
          d.retry_after = Duration::Seconds(1);
          return d;
        }
        // Decided but not kept: like an eviction of the key just made, so
        // remembered like one (else its next request would start fresh).
        budget_->NotKept();
        if (remembered_ != nullptr) {
          remembered_->Remember(Salted(hash), FreshAt(config_, state), now);
        }
        return d;
      }
      admission = KeyBudget::Admission::kAdmitted;
    }
    shard.map.Insert(key, MakeCell(std::move(state)), budget_->keys());
    if (admission == KeyBudget::Admission::kAdmittedSweepDue) {
      lock.unlock();
      budget_->PaySweep(now);
    }
    return d;
  }

 public:
  absl::StatusOr<Decision> Check(std::string_view key, Time now, int64_t cost) override {
    if (absl::Status s = ValidateKey(key); !s.ok()) return s;
    if (absl::Status s = InRange(now); !s.ok()) return s;
    const size_t hash = KeyHash{}(key);
    Shard& shard = ShardFor(hash);
    auto check = [&](State& state) { return CheckInPlace(config_, state, now, cost); };
    {
      ShardGate::Reader reader(shard.gate);
      if (Cell* cell = shard.map.Find(key, hash)) {
        return UpdateCell(*cell, check, reader.holding());
      }
    }
    State state = NewState(hash, now);
    return check(state);
  }

  absl::Status Refund(std::string_view key, Time taken_at, int64_t cost, uint64_t slot) override {
    if (absl::Status s = ValidateKey(key); !s.ok()) return s;
    // A time no packed state can be of: nothing taken then to give back.
    if (!InRange(taken_at, /*first=*/false).ok()) return absl::OkStatus();
    const size_t hash = KeyHash{}(key);
    Shard& shard = ShardFor(hash);
    ShardGate::Reader reader(shard.gate);
    if (Cell* cell = shard.map.Find(key, hash)) {
      UpdateCell(
          *cell,
          [&](State& state) {
            if constexpr (kNamed) {
              if (slot != 0) {
                Release(config_, state, taken_at, slot);
                return Decision{};
              }
            }
            RefundInPlace(config_, state, taken_at, cost);
            return Decision{};
          },
          reader.holding());
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Decision> Renew(std::string_view key, Time taken_at, Time now, int64_t cost,
                                 uint64_t slot) override {
    if (absl::Status s = ValidateKey(key); !s.ok()) return s;
    if (absl::Status s = InRange(now); !s.ok()) return s;
    // Named slots not held (none of this name, or a time no state can be
    // of) are lost: denied, as a check answers otherwise. Counted ones are
    // taken afresh.
    const auto lost = [&]() -> absl::StatusOr<Decision> {
      if (!kNamed || slot == 0) return Decide(key, now, cost);
      absl::StatusOr<Decision> d = Check(key, now, cost);
      if (d.ok()) d->allowed = false;
      return d;
    };
    if (!InRange(taken_at, /*first=*/false).ok()) return lost();
    const size_t hash = KeyHash{}(key);
    Shard& shard = ShardFor(hash);
    {
      ShardGate::Reader reader(shard.gate);
      if (Cell* cell = shard.map.Find(key, hash)) {
        return UpdateCell(
            *cell,
            [&](State& state) {
              if constexpr (kNamed) {
                if (slot != 0) return sluice::Renew(config_, state, taken_at, now, cost, slot);
              }
              RefundInPlace(config_, state, taken_at, cost);
              return DecideInPlace(config_, state, now, cost);
            },
            reader.holding());
      }
    }
    return lost();  // the key holds nothing
  }

  const LimitConfig& config() const override { return limit_config_; }

  SweepProgress Sweep(SweepCursor& cursor, const SweepRule& rule, int64_t max_visits,
                      int64_t max_drops, FreshAtSample& sample) override {
    SweepProgress progress;
    const int64_t now_us = rule.now.unix_micros();
    // The store nears full: commit the remembered keys' table a little at
    // a time (a page per 64 keys visited), well before evictions need it.
    if (remembered_ != nullptr) remembered_->Prefault(std::max<int64_t>(1, max_visits / 64));
    while (cursor.shard < kShards && progress.visits < max_visits && progress.dropped < max_drops) {
      Shard& shard = shards_[cursor.shard];
      ShardGate::Writer writer(shard.gate);
      std::lock_guard lock(writer);
      ++progress.visits;  // entering a shard costs a visit, so empty ones are bounded too
      shard.map.Visit([&](auto& map) {
        auto it = map.begin();
        if (cursor.has_resume) {
          // Resume after the last key kept. Only the sweep erases keys, so
          // it is still here; if the shard was rehashed meanwhile (or moved
          // to packed slots), the order changed and this walk may miss a
          // few keys (the next walk sees them).
          if (auto last = map.find(std::string_view(cursor.resume)); last != map.end()) {
            it = std::next(last);
          }
        }
        auto last_kept = map.end();
        while (it != map.end() && progress.visits < max_visits && progress.dropped < max_drops) {
          ++progress.visits;
          const int64_t fresh_at = FreshAtOf(Keys::CellOf(*it)).unix_micros();
          if (fresh_at <=
              (kRememberedWhole ? rule.lossless_at_or_before_us : rule.drop_at_or_before_us)) {
            if (fresh_at > now_us) {
              ++progress.forced;
              if (remembered_ != nullptr) {
                remembered_->Remember(Salted(KeyHash{}(Keys::KeyOf(*it))),
                                      Time::FromUnixMicros(fresh_at), rule.now);
              }
            }
            map.erase(it++);  // erasing leaves other iterators valid
            ++progress.dropped;
          } else {
            sample.Offer(fresh_at);
            last_kept = it++;
          }
        }
        if (it == map.end()) {
          ++cursor.shard;
          cursor.has_resume = false;
          ++progress.shards_done;
        } else if (last_kept != map.end()) {
          cursor.resume.assign(Keys::KeyOf(*last_kept));
          cursor.has_resume = true;
        }  // else all visited were dropped: resume where this slice resumed
      });
    }
    return progress;
  }

  void Freeze() override {
    // Shared first: Thaw's unlock is another Writer's, which knows no owner's section.
    for (Shard& shard : shards_) shard.gate.Share();
    for (Shard& shard : shards_) ShardGate::Writer(shard.gate).lock();
  }
  int64_t KeysWhileFrozen() const override {
    int64_t held = 0;
    for (const Shard& shard : shards_) held += static_cast<int64_t>(shard.map.size());
    return held;
  }
  void Thaw() override {
    for (Shard& shard : shards_) ShardGate::Writer(shard.gate).unlock();
  }

 private:
  // The gate has a cache line of its own: a writer waiting on it must not
  // steal the line that holds the map's header from the one writing.
  using Keys = ShardMap<Cell>;
  struct alignas(64) Shard {
    ShardGate gate;
    alignas(64) Keys map;
  };

  Shard& ShardFor(size_t hash) { return shards_[hash >> (64 - kShardBits)]; }
  // The keys the store holds, when ShardMap asks.
  auto StoreKeys() const {
    return [this] { return budget_->keys(); };
  }

  // Runs `step` on the cell's state: by compare-and-swap (or its cell's
  // lock), or with plain loads and stores in a section alone.
  template <typename Step>
  Decision UpdateCell(Cell& cell, Step step, Holding holding = Holding::kShared) {
    if constexpr (kPacked) {
      const int64_t base = Base();
      auto packed = [&](uint64_t& word) {
        State state = UnpackWindow<State>(word, packing_, base);
        const Decision d = step(state);
        word = PackWindow(state, packing_, base);
        return d;
      };
      return holding == Holding::kAlone ? cell.UpdateAlone(packed) : cell.Update(packed);
    } else if constexpr (kLog) {
      return cell.Update(step);  // its byte lock, alone or not
    } else {
      return holding == Holding::kAlone ? cell.UpdateAlone(step) : cell.Update(step);
    }
  }
  Time FreshAtOf(const Cell& cell) const {
    if constexpr (kPacked) {
      return FreshAt(config_, UnpackWindow<State>(cell.Get(), packing_, Base()));
    } else {
      return FreshAt(config_, cell.Get());
    }
  }
  Cell MakeCell(State&& state) const {
    if constexpr (kPacked) {
      return Cell(PackWindow(state, packing_, Base()));
    } else {
      return Cell(std::move(state));
    }
  }
  // A packed table keeps the windows of kPackedSpanUs of time from its
  // first window (PackedBaseWindow, fixed by its first decision); it
  // refuses a time outside them rather than store a window its word cannot
  // hold. `first`: a decision's time, which fixes the first window if no
  // decision has yet (a refund's time does not: nothing is held to give
  // back).
  absl::Status InRange(Time t, bool first = true) {
    if constexpr (kPacked) {
      const int64_t us = t.unix_micros();
      const int64_t period = config_.period().micros();
      int64_t base = base_window_.load(std::memory_order_relaxed);
      if (base == kNoBase) [[unlikely]] {
        if (!first) return absl::OutOfRangeError("no decision yet");
        // The first decision's: every thread keeps whichever went in first.
        const int64_t mine = PackedBaseWindow(us, period);
        base = base_window_.compare_exchange_strong(base, mine, std::memory_order_relaxed) ? mine
                                                                                           : base;
      }
      const int64_t start_us = base * period;
      if (us < start_us || us - start_us >= kPackedSpanUs) [[unlikely]] {
        return absl::OutOfRangeError(
            Cat("time ", us, "us is outside what the memory store keeps of a ",
                std::is_same_v<Config, FixedWindowConfig> ? "fixed_window" : "sliding_window",
                " (2^52 us from ", start_us, "us: 2^51 us either side of its first decision)"));
      }
    }
    return absl::OkStatus();
  }
  // The first window of a packed table (InRange has fixed it: a key is
  // held only after a decision).
  int64_t Base() const { return base_window_.load(std::memory_order_relaxed); }

  // The key's hash in RememberedKeys: this table's keys apart from the
  // other tables' (mixed, so that the bits it takes its cells from differ
  // from the shard's).
  uint64_t Salted(size_t hash) const {
    uint64_t h = (static_cast<uint64_t>(hash) ^ salt_) * 0xD6E8FEB86659FD93ULL;
    return h ^ (h >> 32);
  }

  // The state a key not held starts from: fresh, or the most restrictive
  // state that is fresh when the key's remembered state would have been.
  State NewState(size_t hash, Time now) const {
    if (remembered_ != nullptr) {
      if (const std::optional<Time> until = remembered_->Recall(Salted(hash), now)) {
        remembered_->CountRecalled();
        return StateUntil(config_, *until, now);
      }
    }
    return State{};
  }

  const WindowPacking packing_;  // kPacked: PackingOf
  // kPacked: the table's first window (PackedBaseWindow), kNoBase until
  // its first decision.
  static constexpr int64_t kNoBase = INT64_MIN;
  std::atomic<int64_t> base_window_{kNoBase};
  const LimitConfig limit_config_;
  const Config config_;
  const std::shared_ptr<KeyBudget> budget_;
  const std::shared_ptr<RememberedKeys> remembered_;  // null unless OnFull::kRemember
  const uint64_t salt_;
  std::array<Shard, kShards> shards_;
};

}  // namespace
}  // namespace internal

MemoryStore::MemoryStore(MemoryStoreOptions options)
    : options_(options),
      budget_(std::make_shared<internal::KeyBudget>(std::max<int64_t>(1, options.max_keys),
                                                    options.on_full != OnFull::kDenyNew,
                                                    options.on_full == OnFull::kRemember)) {
  if (options.on_full == OnFull::kRemember) {
    const int64_t keys = std::max<int64_t>(1, options.max_keys);
    remembered_ = std::make_shared<internal::RememberedKeys>(
        keys > INT64_MAX / kRememberedCellsPerKey ? INT64_MAX / 2 : keys * kRememberedCellsPerKey);
  }
}

MemoryStore::~MemoryStore() = default;

absl::StatusOr<std::shared_ptr<LimitTable>> MemoryStore::OpenTable(const LimitConfig& config) {
  return std::visit(
      [&](const auto& c) -> std::shared_ptr<LimitTable> {
        const auto& decided = internal::DecidedAs(c);
        using Decided = std::decay_t<decltype(decided)>;
        const uint64_t salt = next_salt_.fetch_add(1) + 1;
        if constexpr (std::is_same_v<Decided, FixedWindowConfig> ||
                      std::is_same_v<Decided, SlidingWindowConfig>) {
          if (const internal::WindowPacking packing = internal::PackingOf(decided);
              packing.count_bits > 0) {
            return std::make_shared<internal::MemoryTable<Decided, true>>(
                config, decided, budget_, remembered_, salt, packing);
          }
        }
        return std::make_shared<internal::MemoryTable<Decided>>(config, decided, budget_,
                                                                remembered_, salt);
      },
      config);
}

MemoryStoreStats MemoryStore::stats() const {
  MemoryStoreStats stats = budget_->stats();
  if (remembered_ != nullptr) {
    stats.remembered = remembered_->remembered();
    stats.recalled = remembered_->recalled();
    stats.remembered_bytes = remembered_->allocated_bytes();
  }
  return stats;
}

}  // namespace sluice
