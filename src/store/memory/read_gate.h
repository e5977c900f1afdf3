// ShardGate and StateCell: how the memory store lets threads decide on one
// shard at once without taking the shard. Internal.
//
// Why: with one spin lock per shard, every decision wrote the lock's cache
// line, and whenever the other core had taken that shard last (about half of
// the decisions with two threads on keys spread over every shard) the line
// had to move between cores first. Distinct keys on two threads then scaled
// to about 1.0x-1.6x one thread, and one hot key to 0.5x-0.7x.
//
// How:
//   - A decision on a key the shard holds is a *read* of the shard's table:
//     it never changes the table's structure, only the key's state, and that
//     is updated atomically in its own cell (StateCell, below: a
//     compare-and-swap, a sequence lock or a byte lock, on the state's own
//     cache line). Readers of one shard run at once.
//   - A reader announces itself in a slot of its own thread (ReaderSlots: one
//     cache line per thread, process-wide) that names the shard it reads, then
//     checks the shard's `writing` flag. Both are sequentially consistent, so
//     of a reader and a writer starting together at least one sees the other
//     (the Dekker pattern): the reader backs off, or the writer waits.
//   - A writer (an insert, the sweep's erases, a rehash) raises the shard's
//     `writing` flag by an exchange (waiting while another writer holds it:
//     the flag is the writers' spin lock too), and waits until no slot names
//     the shard. It then has the table alone, as the spin lock alone gave it
//     before.
// A reader writes only its own slot's line, so readers on different cores do
// not move each other's lines; a hot key's denial that leaves its state as it
// was writes nothing at all.
//
// A shard only one thread has used yet (a store decided on one thread: a
// single-threaded service, a benchmark, a replay) is that thread's alone:
//   - Its sections announce themselves with a plain store to the thread's
//     slot (a release) and read the shard's `owner` with a plain load (an
//     acquire; both are plain moves on x86), and its states are updated
//     with plain loads and stores (StateCell::UpdateAlone). The
//     sequentially consistent store and the compare-and-swap cost a decision
//     over 100k keys 7-10% and one on a hot key 13-15% (bench/README.md):
//     each is a full barrier, which also keeps the next key's cache miss
//     from starting early.
//   - The first other thread to enter shares the shard for good (Share): it
//     marks it `revoking`, runs membarrier(2) (MEMBARRIER_CMD_PRIVATE_EXPEDITED:
//     every running thread of the process passes a full barrier), then waits
//     until the owner's slot no longer names the shard. Of the owner's
//     announcement and its check of `owner`, either the store is seen by the
//     waiter after the barrier, or the check sees `revoking` (the Dekker pair
//     again, the barrier on one side only), so no section of the owner's
//     alone overlaps one of the other thread's. A thread that finds the
//     shard `revoking` waits until it is shared.
//   - Sharing costs one system call a shard, once. Without membarrier (a
//     kernel before 4.14, a sandbox that refuses it) every shard is shared
//     from the start.
//
// Rules: a thread in a read section never enters a write section (it would
// wait for itself), and a read section never blocks. A thread beyond the
// kSlots threads that ever hold a slot at once reads as a writer.
#ifndef SLUICE_STORE_MEMORY_READ_GATE_H_
#define SLUICE_STORE_MEMORY_READ_GATE_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "sluice/decision.h"
#include "store/memory/spin_lock.h"

namespace sluice::internal {

// Per-thread slots naming the shard each thread reads (nullptr: none).
class ReaderSlots {
 public:
  static constexpr int kSlots = 256;
  // The calling thread's slot, claimed on first use and given back when the
  // thread exits; nullptr when all kSlots are held by live threads.
  static std::atomic<const void*>* Mine() {
    if (t_slot_ != nullptr) [[likely]] {
      return t_slot_;
    }
    return Claim();
  }
  // Returns once no slot names `shard`. The caller has raised the shard's
  // `writing` flag (seq_cst) before: a reader that starts later backs off.
  static void WaitUntilNoneReads(const void* shard);

 private:
  struct Release;  // gives the slot back at the thread's exit
  static std::atomic<const void*>* Claim();
  static thread_local std::atomic<const void*>* t_slot_;
  static thread_local Release t_release_;
};

// Whether a section has its shard to itself (ShardGate's owner, alone) or
// shares it with other threads' sections.
enum class Holding { kShared, kAlone };

// One shard's gate: one flag, the writers' spin lock and what readers
// check at once (raising it is one exchange, the writer's side of the
// Dekker pair), and the shard's owner while only one thread has used it.
class ShardGate {
 public:
  ShardGate();

  // A write section (BasicLockable: std::unique_lock<ShardGate::Writer>).
  // The owner's alone, or the shard's alone among threads that share it.
  class Writer {
   public:
    explicit Writer(ShardGate& gate) : gate_(gate) {}
    void lock() {
      if (std::atomic<const void*>* slot = ReaderSlots::Mine(); gate_.EnterAlone(slot)) {
        alone_ = slot;
        return;
      }
      while (gate_.writing_.exchange(true, std::memory_order_seq_cst)) gate_.WaitForWriter();
      ReaderSlots::WaitUntilNoneReads(&gate_);
    }
    void unlock() {
      if (alone_ != nullptr) {
        alone_->store(nullptr, std::memory_order_release);
        alone_ = nullptr;
        return;
      }
      gate_.writing_.store(false, std::memory_order_release);
    }

   private:
    ShardGate& gate_;
    std::atomic<const void*>* alone_ = nullptr;  // the owner's slot, in a section alone
  };

  // A read section, for the scope of the object.
  class Reader {
   public:
    // Inlined whole, the rare paths out of line: on the path of every
    // decision, alone or shared.
    [[gnu::always_inline]] explicit Reader(ShardGate& gate)
        : gate_(gate), slot_(ReaderSlots::Mine()) {
      if (gate_.EnterAlone(slot_)) [[likely]] {
        holding_ = Holding::kAlone;
        return;
      }
      if (slot_ == nullptr) [[unlikely]] {
        gate_.LockAsWriter();
        return;
      }
      for (;;) {
        slot_->store(&gate_, std::memory_order_seq_cst);
        if (!gate_.writing_.load(std::memory_order_seq_cst)) [[likely]] {
          return;
        }
        slot_->store(nullptr, std::memory_order_release);
        gate_.WaitForWriter();
      }
    }
    [[gnu::always_inline]] ~Reader() {
      if (slot_ == nullptr) [[unlikely]] {
        Writer(gate_).unlock();
        return;
      }
      slot_->store(nullptr, std::memory_order_release);
    }
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;

    // kAlone: no other thread's section runs on the shard (UpdateAlone).
    Holding holding() const { return holding_; }

   private:
    ShardGate& gate_;
    std::atomic<const void*>* const slot_;
    Holding holding_ = Holding::kShared;
  };

  // A write section for a reader without a slot (out of line: rare).
  void LockAsWriter();

  // Shares the shard from now on: returns once no section of its owner's
  // alone runs. Any thread, in no section of this shard.
  void Share();
  // Whether the shard is still one thread's alone (or nobody's yet).
  bool owned() const {
    const void* owner = owner_.load(std::memory_order_relaxed);
    return owner != kShared && owner != kRevoking;
  }

 private:
  // owner_ when no thread owns the shard: shared, or being made shared.
  static inline const void* const kShared = reinterpret_cast<const void*>(1);
  static inline const void* const kRevoking = reinterpret_cast<const void*>(2);

  // Enters a section alone and returns true when the calling thread (its
  // `slot`) owns the shard, or takes it while nobody has; else false, with
  // the shard shared (Share) and the section not entered.
  [[gnu::always_inline]] bool EnterAlone(std::atomic<const void*>* slot) {
    // Acquire (a plain load on x86): a thread that finds the shard shared
    // also sees what its owner wrote alone, which the thread that shared it
    // saw (Share's acquire of the owner's slot, then its release of
    // kShared). Relaxed, it would read the table with no order to the
    // owner's inserts (TSan's race in memory_store_concurrency_test).
    const void* owner = owner_.load(std::memory_order_acquire);
    if (owner != slot || slot == nullptr) [[unlikely]] {
      if (owner == kShared || !TakeOrShare(slot)) return false;
    }
    // A release store (a plain one on x86): it also carries the owner's
    // earlier plain writes to whoever reads the slot (Share's wait).
    slot->store(this, std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // membarrier orders the rest
    if (owner_.load(std::memory_order_acquire) == slot) [[likely]] {
      return true;
    }
    slot->store(nullptr, std::memory_order_release);
    Share();  // being shared by another thread: wait for it
    return false;
  }
  // EnterAlone's section on a shard it does not own: takes it for `slot`
  // when nobody has (true), else shares it (false). Out of line: rare.
  bool TakeOrShare(std::atomic<const void*>* slot);
  void WaitForWriter() const;

  std::atomic<bool> writing_{false};
  // nullptr (nobody yet), the owner's reader slot, kRevoking or kShared.
  std::atomic<const void*> owner_;
};

// A key's state, updated by many readers at once, in one of three forms:
//   - one word (gcra, token_bucket as gcra, leaky_bucket_shape): a
//     compare-and-swap of the word;
//   - a few words (fixed_window, sliding_window, ...): a
//     sequence lock. The words are read (relaxed atomics) between two reads
//     of an even version; the step runs on that copy; the copy is installed
//     by a compare-and-swap of the version from what was read to odd, so it
//     is installed only if nobody wrote since, and the version goes back to
//     even past it. A reader never waits on a lock whose holder sits on the
//     same cache line, which with two threads on one hot key made a spin
//     lock here slower than the shard lock it replaced;
//   - anything else (the sliding log's timestamps): a one-byte spin lock.
// In the first two forms a step that leaves the state as it was (most
// denials) writes nothing, so threads denied on one hot key share its line.
// Get reads the state plainly: only inside a write section, where nobody
// updates it.
template <typename State>
inline constexpr bool kWordState = std::is_trivially_copyable_v<State> &&
                                   sizeof(State) % sizeof(uint64_t) == 0 &&
                                   alignof(State) == alignof(uint64_t);

enum class CellForm { kOneWord, kWords, kLocked };
template <typename State>
inline constexpr CellForm kCellForm = !kWordState<State>                  ? CellForm::kLocked
                                      : sizeof(State) == sizeof(uint64_t) ? CellForm::kOneWord
                                                                          : CellForm::kWords;

template <typename State, CellForm kForm = kCellForm<State>>
class StateCell;

// The words of a trivially copyable state.
template <typename State>
class StateWords {
 public:
  static constexpr size_t kWords = sizeof(State) / sizeof(uint64_t);
  explicit StateWords(const State& state) { std::memcpy(words_, &state, sizeof(State)); }
  State Get() const {
    State state;
    std::memcpy(&state, words_, sizeof(State));
    return state;
  }

 protected:
  uint64_t words_[kWords];
};

template <typename State>
class StateCell<State, CellForm::kOneWord> : public StateWords<State> {
 public:
  using StateWords<State>::StateWords;
  StateCell(StateCell&& other) noexcept : StateWords<State>(other.Get()) {}

  // Runs `step` (Decision(State&)) on a copy of the state and installs the
  // copy if the word is still what it was copied from; else again.
  template <typename Step>
  Decision Update(Step step) {
    std::atomic_ref<uint64_t> word(this->words_[0]);
    uint64_t seen = word.load(std::memory_order_acquire);
    for (;;) {
      State state;
      std::memcpy(&state, &seen, sizeof seen);
      Decision d = step(state);
      uint64_t next;
      std::memcpy(&next, &state, sizeof next);
      if (next == seen) return d;
      if (word.compare_exchange_weak(seen, next, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
        return d;
      }
    }
  }
  // The same in a section alone (Holding::kAlone): plain loads and stores.
  template <typename Step>
  Decision UpdateAlone(Step step) {
    std::atomic_ref<uint64_t> word(this->words_[0]);
    const uint64_t seen = word.load(std::memory_order_relaxed);
    State state;
    std::memcpy(&state, &seen, sizeof seen);
    Decision d = step(state);
    uint64_t next;
    std::memcpy(&next, &state, sizeof next);
    if (next != seen) word.store(next, std::memory_order_relaxed);
    return d;
  }
};

template <typename State>
class StateCell<State, CellForm::kWords> : public StateWords<State> {
  using Base = StateWords<State>;

 public:
  using Base::Base;
  StateCell(StateCell&& other) noexcept : Base(other.Get()) {}

  template <typename Step>
  Decision Update(Step step) {
    std::atomic_ref<uint32_t> version(version_);
    int spins = 0;
    for (;;) {
      uint32_t seen = version.load(std::memory_order_acquire);
      if (seen & 1) {  // a write in progress: a few dozen nanoseconds
        SpinLock::Wait(spins);
        continue;
      }
      uint64_t copy[Base::kWords];
      for (size_t i = 0; i < Base::kWords; ++i) {
        copy[i] = std::atomic_ref<uint64_t>(this->words_[i]).load(std::memory_order_relaxed);
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      if (version.load(std::memory_order_relaxed) != seen) continue;  // torn: read again
      State state;
      std::memcpy(&state, copy, sizeof(State));
      Decision d = step(state);
      if (std::memcmp(&state, copy, sizeof(State)) == 0) return d;
      // Installed only if nobody wrote since `seen`: then `copy` was current.
      if (!version.compare_exchange_strong(seen, seen + 1, std::memory_order_acquire,
                                           std::memory_order_relaxed)) {
        continue;
      }
      uint64_t next[Base::kWords];
      std::memcpy(next, &state, sizeof(State));
      for (size_t i = 0; i < Base::kWords; ++i) {
        std::atomic_ref<uint64_t>(this->words_[i]).store(next[i], std::memory_order_relaxed);
      }
      version.store(seen + 2, std::memory_order_release);
      return d;
    }
  }
  // The same in a section alone (Holding::kAlone): plain loads and stores,
  // the version left as it is (nobody reads the words meanwhile).
  template <typename Step>
  Decision UpdateAlone(Step step) {
    uint64_t copy[Base::kWords];
    for (size_t i = 0; i < Base::kWords; ++i) {
      copy[i] = std::atomic_ref<uint64_t>(this->words_[i]).load(std::memory_order_relaxed);
    }
    State state;
    std::memcpy(&state, copy, sizeof(State));
    Decision d = step(state);
    if (std::memcmp(&state, copy, sizeof(State)) == 0) return d;
    uint64_t next[Base::kWords];
    std::memcpy(next, &state, sizeof(State));
    for (size_t i = 0; i < Base::kWords; ++i) {
      std::atomic_ref<uint64_t>(this->words_[i]).store(next[i], std::memory_order_relaxed);
    }
    return d;
  }

 private:
  uint32_t version_ = 0;  // odd while a step's result is being written
};

template <typename State>
class StateCell<State, CellForm::kLocked> {
 public:
  explicit StateCell(State state) : state_(std::move(state)) {}
  StateCell(StateCell&& other) noexcept : state_(std::move(other.state_)) {}

  template <typename Step>
  Decision Update(Step step) {
    std::lock_guard guard(lock_);
    return step(state_);
  }
  // Alone, the same: a byte lock nobody else takes is cheap beside the
  // state's own work.
  template <typename Step>
  Decision UpdateAlone(Step step) {
    return Update(step);
  }
  const State& Get() const { return state_; }

 private:
  SpinLock lock_;
  State state_;
};

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_READ_GATE_H_
