#include "store/memory/read_gate.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace sluice::internal {
namespace {

struct alignas(64) Slot {
  std::atomic<const void*> reads{nullptr};
};

// Constant-initialized and never destroyed: threads may exit (and give
// their slots back) while the process's static objects are torn down.
Slot g_slots[ReaderSlots::kSlots];
// Slots [0, g_claimed) have been claimed at some time; a writer looks at
// those. Sequentially consistent with the slots' stores and the writer's
// flag: a thread whose claim a writer missed sees that writer's flag.
std::atomic<int> g_claimed{0};

std::mutex g_free_mu;
int g_free[ReaderSlots::kSlots];  // slots given back by exited threads
int g_free_count = 0;

thread_local bool t_no_slot = false;

// membarrier(2) with MEMBARRIER_CMD_PRIVATE_EXPEDITED, registered once for
// the process: whether a shard may be one thread's alone (ShardGate::Share).
bool MembarrierReady() {
  static const bool ready = [] {
    const long commands = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    return commands >= 0 && (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0 &&
           syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  }();
  return ready;
}

}  // namespace

thread_local std::atomic<const void*>* ReaderSlots::t_slot_ = nullptr;

// Gives the thread's slot back when the thread exits. A thread_local
// destroyed after this one that still decides reads as a writer.
struct ReaderSlots::Release {
  int index = -1;
  ~Release() {
    if (index < 0) return;
    t_slot_ = nullptr;
    t_no_slot = true;
    std::lock_guard lock(g_free_mu);
    g_free[g_free_count++] = index;
  }
};

thread_local ReaderSlots::Release ReaderSlots::t_release_;

std::atomic<const void*>* ReaderSlots::Claim() {
  if (t_no_slot) return nullptr;
  int index = -1;
  {
    std::lock_guard lock(g_free_mu);
    if (g_free_count > 0) {
      index = g_free[--g_free_count];
    } else if (g_claimed.load(std::memory_order_relaxed) < kSlots) {
      index = g_claimed.fetch_add(1, std::memory_order_seq_cst);
    }
  }
  if (index < 0) {
    t_no_slot = true;
    return nullptr;
  }
  t_release_.index = index;
  t_slot_ = &g_slots[index].reads;
  return t_slot_;
}

void ReaderSlots::WaitUntilNoneReads(const void* shard) {
  const int claimed = g_claimed.load(std::memory_order_seq_cst);
  for (int i = 0; i < claimed; ++i) {
    int spins = 0;
    while (g_slots[i].reads.load(std::memory_order_seq_cst) == shard) SpinLock::Wait(spins);
  }
}

ShardGate::ShardGate() : owner_(MembarrierReady() ? nullptr : kShared) {}

void ShardGate::Share() {
  const void* owner = owner_.load(std::memory_order_acquire);
  for (;;) {
    if (owner == kShared) return;
    if (owner == kRevoking) {  // another thread shares it: a section's wait at most
      int spins = 0;
      while (owner_.load(std::memory_order_acquire) != kShared) SpinLock::Wait(spins);
      return;
    }
    if (owner_.compare_exchange_weak(owner, kRevoking, std::memory_order_seq_cst)) break;
  }
  if (owner != nullptr) {
    // Every running thread passes a full barrier: the owner's announcement
    // in its slot is seen below, or it sees kRevoking at its next check.
    // Registered (MembarrierReady) before any shard could be owned, so it
    // cannot fail.
    syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    const auto* slot = static_cast<const std::atomic<const void*>*>(owner);
    int spins = 0;
    while (slot->load(std::memory_order_acquire) == this) SpinLock::Wait(spins);
  }
  owner_.store(kShared, std::memory_order_release);
}

bool ShardGate::TakeOrShare(std::atomic<const void*>* slot) {
  const void* owner = owner_.load(std::memory_order_acquire);
  if (slot != nullptr) {
    if (owner == slot) return true;
    if (owner == nullptr &&
        owner_.compare_exchange_strong(owner, slot, std::memory_order_relaxed)) {
      return true;
    }
  }
  Share();
  return false;
}

void ShardGate::LockAsWriter() { Writer(*this).lock(); }

void ShardGate::WaitForWriter() const {
  int spins = 0;
  while (writing_.load(std::memory_order_acquire)) SpinLock::Wait(spins);
}

}  // namespace sluice::internal
