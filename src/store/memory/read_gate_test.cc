// Run under TSan by scripts/test (label "concurrency"): a read section that
// overlapped a write section would show as a data race there, and as a
// broken invariant here.
#include "store/memory/read_gate.h"

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace sluice::internal {
namespace {

constexpr int kThreads = 8;

// Writers grow a vector (reallocating it) and keep every element equal to
// its index; readers check that in read sections. A reader that ran during
// a write would read a freed buffer or a half-written element.
TEST(ShardGateTest, ReadersNeverOverlapAWriter) {
  ShardGate gate;
  std::vector<int64_t> values;  // guarded by `gate`
  std::atomic<bool> writing{true};
  std::atomic<int64_t> reads{0};
  std::vector<std::thread> threads;
  // The writers go on until the readers have read a while too (at least
  // kMinReads read sections), however the threads are scheduled.
  constexpr int64_t kMinReads = 2'000;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2'000 || (reads.load() < kMinReads && i < 2'000'000); ++i) {
        ShardGate::Writer writer(gate);
        std::lock_guard lock(writer);
        values.push_back(static_cast<int64_t>(values.size()));
        if (values.size() > 512) {  // and shrink again, freeing the buffer
          values.clear();
          values.shrink_to_fit();
        }
      }
    });
  }
  for (int t = 2; t < kThreads; ++t) {
    threads.emplace_back([&] {
      while (writing.load(std::memory_order_relaxed)) {
        ShardGate::Reader reader(gate);
        for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], static_cast<int64_t>(i));
        reads.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  threads[0].join();
  threads[1].join();
  writing.store(false);
  for (size_t t = 2; t < threads.size(); ++t) threads[t].join();
  EXPECT_GE(reads.load(), kMinReads);
}

// More threads at once than there are reader slots: those without one read
// as writers, and the gate still excludes.
TEST(ShardGateTest, ThreadsBeyondTheSlotsReadAsWriters) {
  constexpr int kMany = ReaderSlots::kSlots + 16;
  ShardGate gate;
  int64_t counter = 0;  // guarded by `gate`: changed only in write sections
  std::barrier all_started(kMany);
  std::atomic<int> without_slot{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kMany; ++t) {
    threads.emplace_back([&, t] {
      // Every thread claims its slot before any exits, so some find none.
      if (ReaderSlots::Mine() == nullptr) without_slot.fetch_add(1);
      all_started.arrive_and_wait();
      for (int i = 0; i < 20; ++i) {
        if (t % 4 == 0) {
          ShardGate::Writer writer(gate);
          std::lock_guard lock(writer);
          ++counter;
        } else {
          ShardGate::Reader reader(gate);
          ASSERT_GE(counter, 0);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter, 20 * ((kMany + 3) / 4));
  EXPECT_GE(without_slot.load(), kMany - ReaderSlots::kSlots);
}

// A shard only one thread has used is that thread's alone: its sections
// say so, write sections too. The first section of another thread shares it
// for good.
TEST(ShardGateTest, AShardIsItsOnlyThreadsAloneUntilAnotherComes) {
  ShardGate gate;
  if (!gate.owned()) GTEST_SKIP() << "no membarrier(2) here: every shard is shared";
  {
    ShardGate::Reader reader(gate);
    EXPECT_EQ(reader.holding(), Holding::kAlone);
  }
  {
    ShardGate::Writer writer(gate);
    std::lock_guard lock(writer);
  }
  {
    ShardGate::Reader reader(gate);
    EXPECT_EQ(reader.holding(), Holding::kAlone);
  }
  EXPECT_TRUE(gate.owned());
  std::thread([&] {
    ShardGate::Reader reader(gate);
    EXPECT_EQ(reader.holding(), Holding::kShared);
  }).join();
  EXPECT_FALSE(gate.owned());
  ShardGate::Reader reader(gate);
  EXPECT_EQ(reader.holding(), Holding::kShared);
}

// The owner updates a counter alone (plain loads and stores) and writes
// the shard's table while a second thread comes and does the same, many
// times over: not one update is lost, and no read section sees the table
// mid-change. Sharing must wait out the owner's section alone (under TSan,
// a section that overlapped shows as a race).
TEST(ShardGateTest, SharingWaitsOutTheOwnersSectionAlone) {
  constexpr int kRounds = 100;
  constexpr int kOwnerSections = 3'000;
  constexpr int kOtherSections = 1'000;
  int64_t owner_alone = 0;
  for (int round = 0; round < kRounds; ++round) {
    ShardGate gate;
    if (!gate.owned()) GTEST_SKIP() << "no membarrier(2) here: every shard is shared";
    StateCell<int64_t> cell(0);
    std::vector<int64_t> values;  // guarded by `gate`
    std::atomic<bool> come{false};
    // Returns whether the section was alone.
    auto section = [&](int i) {
      if (i % 8 == 0) {
        ShardGate::Writer writer(gate);
        std::lock_guard lock(writer);
        values.push_back(static_cast<int64_t>(values.size()));
        if (values.size() > 64) {
          values.clear();
          values.shrink_to_fit();
        }
        return false;
      }
      ShardGate::Reader reader(gate);
      for (size_t j = 0; j < values.size(); ++j) EXPECT_EQ(values[j], static_cast<int64_t>(j));
      auto add = [](int64_t& n) {
        ++n;
        return Decision{};
      };
      if (reader.holding() == Holding::kAlone) {
        if (i == 65 + round % 7) {  // a read section (not a multiple of 8)
          // The other thread comes in the middle of this section, which
          // then lasts a while: any section of its meanwhile is lost here.
          cell.UpdateAlone([&](int64_t& n) {
            come.store(true, std::memory_order_relaxed);
            const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
            while (std::chrono::steady_clock::now() < until) {
            }
            return add(n);
          });
          return true;
        }
        cell.UpdateAlone(add);
        return true;
      }
      cell.Update(add);
      return false;
    };
    int64_t alone = 0;
    // Both threads hold their reader slots before either enters a section
    // (a thread that takes the slot of one that exited is its successor).
    std::barrier slots_held(2);
    std::thread owner([&] {
      ReaderSlots::Mine();
      slots_held.arrive_and_wait();
      for (int i = 0; i < kOwnerSections; ++i) {
        alone += section(i) ? 1 : 0;
      }
      come.store(true, std::memory_order_relaxed);  // (in case it never came: fails below)
    });
    std::thread other([&] {
      ReaderSlots::Mine();
      slots_held.arrive_and_wait();
      while (!come.load(std::memory_order_relaxed)) {
      }
      for (int i = 1; i <= kOtherSections; ++i) section(i);
    });
    owner.join();
    other.join();
    const auto reads = [](int n, int from) {
      int r = 0;
      for (int i = from; i < n + from; ++i) r += i % 8 != 0;
      return r;
    };
    ASSERT_EQ(cell.Get(), reads(kOwnerSections, 0) + reads(kOtherSections, 1)) << "round " << round;
    EXPECT_FALSE(gate.owned());
    owner_alone += alone;
  }
  EXPECT_GT(owner_alone, kRounds * 50);  // the owner's first sections were alone
}

// kThreads threads each run `step` on `cell` kUpdates times, all at once.
constexpr int kUpdates = 5'000;
template <typename Cell, typename Step>
void UpdateFromEveryThread(Cell& cell, Step step) {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kUpdates; ++i) cell.Update(step);
    });
  }
  for (std::thread& t : threads) t.join();
}

// A state of three words updated from many threads at once (a sequence lock
// in StateCell): every update sees the three words equal (never a torn
// copy), and none is lost.
struct ThreeWords {
  int64_t a = 0, b = 0, c = 0;
};
static_assert(kCellForm<ThreeWords> == CellForm::kWords);

TEST(StateCellTest, WordsAreNeverTornNorLost) {
  StateCell<ThreeWords> cell(ThreeWords{});
  UpdateFromEveryThread(cell, [](ThreeWords& s) {
    EXPECT_TRUE(s.a == s.b && s.b == s.c) << s.a << " " << s.b << " " << s.c;
    ++s.a, ++s.b, ++s.c;
    return Decision{.allowed = true};
  });
  const ThreeWords end = cell.Get();
  EXPECT_EQ(end.a, int64_t{kThreads} * kUpdates);
  EXPECT_EQ(end.b, end.a);
  EXPECT_EQ(end.c, end.a);
}

TEST(StateCellTest, OneWordUpdatesAreNeverLost) {
  static_assert(kCellForm<int64_t> == CellForm::kOneWord);
  StateCell<int64_t> cell(0);
  UpdateFromEveryThread(cell, [](int64_t& s) {
    ++s;
    return Decision{};
  });
  EXPECT_EQ(cell.Get(), int64_t{kThreads} * kUpdates);
}

}  // namespace
}  // namespace sluice::internal
