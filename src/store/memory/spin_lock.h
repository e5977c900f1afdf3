// SpinLock: a one-byte test-and-test-and-set lock for critical sections of a
// few dozen nanoseconds (one hash lookup and one Decide). Internal.
//
// Why not std::mutex: its lock+unlock costs two atomic read-modify-writes
// plus a futex check, about as much as the work it guards. Why it is safe to
// spin: the guarded section never blocks, allocates rarely and never calls
// out. After a short spin the waiter yields, so a preempted holder on an
// oversubscribed machine is not spun against for a whole time slice.
#ifndef SLUICE_STORE_MEMORY_SPIN_LOCK_H_
#define SLUICE_STORE_MEMORY_SPIN_LOCK_H_

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace sluice::internal {

class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      // Wait by reading (the line stays shared) and retry only when free.
      int spins = 0;
      while (locked_.load(std::memory_order_relaxed)) Wait(spins);
    }
  }
  bool try_lock() { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() { locked_.store(false, std::memory_order_release); }

  // One turn of waiting for a holder, `spins` counting the turns: the first
  // 64 reads go without a pause (a holder's section is a few dozen
  // nanoseconds, and a pause costs about as much, so a waiter that pauses at
  // once takes the lock late: two threads on one hot key, bench/README.md),
  // then a pause each, and every 1024 turns the CPU is yielded (the holder
  // was probably preempted). Every spin wait of the memory store uses it.
  static void Wait(int& spins) {
    if (++spins < 1024) {
      if (spins > 64) Pause();
    } else {
      std::this_thread::yield();
      spins = 0;
    }
  }

 private:
  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }
  std::atomic<bool> locked_{false};
};

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_SPIN_LOCK_H_
