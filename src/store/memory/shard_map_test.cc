#include "store/memory/shard_map.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "store/memory/compact_key.h"
#include "store/memory/read_gate.h"

namespace sluice::internal {
namespace {

using Cell = StateCell<uint64_t>;
using Map = ShardMap<Cell>;

std::string Key(size_t i) { return "key-" + std::to_string(i); }

uint64_t ValueAt(Map& map, const std::string& key) {
  Cell* cell = map.Find(key, KeyHash{}(key));
  return cell == nullptr ? UINT64_MAX : cell->Get();
}

const auto kFewKeys = [] { return int64_t{0}; };

TEST(ShardMap, StartsPackedAndMovesASmallShardToLinesOnce) {
  Map map;
  EXPECT_TRUE(map.packed());
  for (size_t i = 0; i < 10; ++i) map.Insert(Key(i), Cell(i), 0);
  EXPECT_TRUE(map.packed());
  EXPECT_TRUE(map.WantsLines(kFewKeys));
  EXPECT_FALSE(map.WantsLines([] { return Map::kLineStoreKeysMax; }));  // a store with many keys
  map.Unpack();
  EXPECT_FALSE(map.packed());
  EXPECT_FALSE(map.WantsLines(kFewKeys));
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(ValueAt(map, Key(i)), i);
  // Grown past kLineKeysMax it packs, and never moves to lines again.
  for (size_t i = 10; i < Map::kLineKeysMax + 1; ++i) map.Insert(Key(i), Cell(i), 0);
  EXPECT_TRUE(map.packed());
  EXPECT_FALSE(map.WantsLines(kFewKeys));
  for (size_t i = 0; i <= Map::kLineKeysMax; ++i) EXPECT_EQ(ValueAt(map, Key(i)), i);
}

TEST(ShardMap, APackedShardOfHalfTheLineKeysOrMoreStaysPacked) {
  Map map;
  for (size_t i = 0; i < Map::kLineKeysMax / 2; ++i) map.Insert(Key(i), Cell(i), 0);
  EXPECT_FALSE(map.WantsLines(kFewKeys));
}

TEST(ShardMap, ASmallShardKeepsEachKeyAndCellInLinesOfTheirOwn) {
  static_assert(sizeof(Map::LineEntry) == 128 && alignof(Map::LineEntry) == 128);
  Map map;
  for (size_t i = 0; i < 10; ++i) map.Insert(Key(i), Cell(i), 0);
  map.Unpack();
  for (size_t i = 0; i < 10; ++i) {
    const std::string key = Key(i);
    const auto cell = reinterpret_cast<uintptr_t>(map.Find(key, KeyHash{}(key)));
    EXPECT_EQ(cell % 128, 64u) << key;  // the entry's second line; the key in its first
  }
}

TEST(ShardMap, KeysAndStatesSurviveTheMoveToPackedSlots) {
  Map map;
  map.Unpack();
  const size_t n = Map::kLineKeysMax + 50;
  for (size_t i = 0; i < n; ++i) {
    map.Insert(Key(i), Cell(i * 7), 0);
    ASSERT_EQ(map.size(), i + 1);
    // Every key inserted so far, before and after the move.
    if (i == Map::kLineKeysMax - 1 || i == Map::kLineKeysMax || i == n - 1) {
      for (size_t j = 0; j <= i; ++j) ASSERT_EQ(ValueAt(map, Key(j)), j * 7) << i << " " << j;
    }
  }
  EXPECT_TRUE(map.packed());
  EXPECT_EQ(ValueAt(map, "absent"), UINT64_MAX);
  // A cell found is the key's own: an update through it is seen again.
  const std::string key = Key(3);
  map.Find(key, KeyHash{}(key))->UpdateAlone([](uint64_t& v) {
    v = 1'000'000;
    return Decision{};
  });
  EXPECT_EQ(ValueAt(map, key), 1'000'000u);
}

TEST(ShardMap, AShardOfAStoreWithManyKeysPacksAtItsNextInsert) {
  Map map;
  map.Unpack();
  for (size_t i = 0; i < 10; ++i) map.Insert(Key(i), Cell(i), Map::kLineStoreKeysMax - 1);
  EXPECT_FALSE(map.packed());
  map.Insert(Key(10), Cell(10), Map::kLineStoreKeysMax);
  EXPECT_TRUE(map.packed());
  for (size_t i = 0; i <= 10; ++i) EXPECT_EQ(ValueAt(map, Key(i)), i);
  // Packed for good, whatever the store holds later.
  map.Insert(Key(11), Cell(11), 0);
  EXPECT_TRUE(map.packed());
  EXPECT_EQ(ValueAt(map, Key(11)), 11u);
}

TEST(ShardMap, ACellLargerThanALineIsPackedFromTheStart) {
  struct Big {
    explicit Big(uint64_t v) : value(v) {}
    uint64_t value;
    char rest[72] = {};
  };
  ShardMap<Big> map;
  EXPECT_TRUE(map.packed());
  map.Insert("a", Big(1), 0);
  EXPECT_FALSE(map.WantsLines(kFewKeys));
  map.Unpack();
  EXPECT_TRUE(map.packed());
  EXPECT_EQ(map.Find("a", KeyHash{}(std::string_view("a")))->value, 1u);
}

TEST(ShardMap, VisitWalksAndErasesInEitherLayout) {
  for (const size_t n : {size_t{20}, Map::kLineKeysMax + 20}) {
    Map map;
    map.Unpack();
    for (size_t i = 0; i < n; ++i) map.Insert(Key(i), Cell(i), 0);
    EXPECT_EQ(map.packed(), n > Map::kLineKeysMax);
    size_t seen = 0;
    map.Visit([&](auto& m) {
      for (auto it = m.begin(); it != m.end();) {
        ++seen;
        const uint64_t value = Map::CellOf(*it).Get();
        EXPECT_EQ(Map::KeyOf(*it), Key(value));
        if (value % 2 == 0) {
          m.erase(it++);
        } else {
          ++it;
        }
      }
    });
    EXPECT_EQ(seen, n);
    EXPECT_EQ(map.size(), n / 2);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(ValueAt(map, Key(i)), i % 2 == 0 ? UINT64_MAX : i) << n << " " << i;
    }
  }
}

}  // namespace
}  // namespace sluice::internal
