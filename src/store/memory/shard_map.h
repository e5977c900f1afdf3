// ShardMap: one shard's keys and their cells, in one of two layouts.
// Internal to the memory store.
//
// Why two: a table slot of a key (16 bytes) and a one-word cell (8) is 24
// bytes, so a cache line holds parts of two or three keys. When threads
// write the states of different keys that share a line, each write takes
// the line from the other core: two threads deciding on 1,000 keys each,
// every decision passing, made no more decisions than one
// (BM_StoreDistinctKeys, bench/README.md, "Keys of their own lines"). A
// small shard that threads share therefore gives each key two lines of its
// own (LineEntry, 128 bytes, the pair of lines a core's prefetcher fetches
// together): its key, which only inserts write, and its cell, which
// decisions write. With the key and the cell in one line of the pair, two
// threads made 1.4-1.5x one; apart, 1.65-1.8x.
//
// A shard starts packed, and one thread alone (a single-threaded service,
// `sluice replay`) keeps it so: in lines, a decision reads two lines
// where it read one, 4-8% more time at a few thousand keys. The first
// decision another thread makes on a packed shard of fewer than
// kLineKeysMax / 2 keys, in a store of fewer than kLineStoreKeysMax, moves
// its keys to lines (WantsLines, then Unpack in a write section), once. A
// shard in lines that reaches kLineKeysMax keys, or gains one while its
// store holds kLineStoreKeysMax, moves them back to packed slots for good
// (a fifth of the memory a slot), where a line written by two cores costs
// less: over many keys a line is seldom still in the other core's cache;
// and however many tables a store has, its keys in lines stay about
// kLineStoreKeysMax (5-10 MiB). Cells larger than a line (the sliding
// log's) are always packed.
//
// What `compact_` says changes only in a write section (ShardGate), so a
// reader sees one layout for its whole section, and a cell a reader holds
// stays where it is until the section ends.
#ifndef SLUICE_STORE_MEMORY_SHARD_MAP_H_
#define SLUICE_STORE_MEMORY_SHARD_MAP_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "store/memory/compact_key.h"

namespace sluice::internal {

template <typename Cell>
class ShardMap {
 public:
  // The most keys a shard keeps in lines of their own (6,144 a table); a
  // shard moves to lines with fewer than half as many. Lines are kept at
  // most 7/16 full (LinesFor): at 96 keys, 255 slots, 32 KiB.
  static constexpr size_t kLineKeysMax = 96;
  // The most keys a store holds before its shards pack as they gain keys:
  // at 128 bytes a slot and 7/32 to 7/16 of the slots used, 4.7-9.4 MiB.
  static constexpr int64_t kLineStoreKeysMax = 16'384;

  // A key and its cell, each in a line of its own, in a pair of lines of
  // their own. The cell is mutable: a set's elements are const, and the
  // cell is all that changes.
  struct alignas(128) LineEntry {
    LineEntry(CompactKey k, Cell c) : key(std::move(k)), cell(std::move(c)) {}
    CompactKey key;
    alignas(64) mutable Cell cell;
  };
  using PackedEntry = std::pair<const CompactKey, Cell>;

  // The cell of `key` (its `hash` is KeyHash's), or nullptr. Inside a read
  // or write section of the shard. Inlined whole, with the map's probe
  // and the keys' comparison (flatten): each out of line cost a decision
  // over 100k keys about 50 instructions more (callgrind).
  [[gnu::always_inline, gnu::flatten]] Cell* Find(std::string_view key, size_t hash) {
    if (compact_) [[likely]] {  // the fall-through: one thread, or many keys (memory-bound)
      auto it = packed_.find(key, hash);
      return it == packed_.end() ? nullptr : &it->second;
    }
    auto it = lines_.find(key, hash);
    return it == lines_.end() ? nullptr : &it->cell;
  }

  // Whether a decision that shares the shard with other threads should
  // move its keys to lines of their own (Unpack); `store_keys()` gives the
  // keys its store holds, read only when the rest says yes. In a read or
  // write section.
  template <typename StoreKeys>
  bool WantsLines(StoreKeys store_keys) const {
    return compact_ && !unpacked_ && sizeof(Cell) <= 64 && packed_.size() < kLineKeysMax / 2 &&
           store_keys() < kLineStoreKeysMax;
  }
  // Moves every key to lines of their own, once in the map's life. In a
  // write section.
  void Unpack() {
    if (!compact_ || unpacked_ || sizeof(Cell) > 64) return;
    unpacked_ = true;
    LinesFor(packed_.size());
    MoveAll(packed_, lines_);
    compact_ = false;
  }

  // Adds `key`, which the map does not hold, to a store that holds
  // `store_keys` keys. In a write section.
  void Insert(std::string_view key, Cell cell, int64_t store_keys) {
    if (!compact_ && (lines_.size() >= kLineKeysMax || store_keys >= kLineStoreKeysMax)) Pack();
    if (compact_) {
      packed_.emplace(CompactKey(key), std::move(cell));
    } else {
      LinesFor(lines_.size() + 1);
      lines_.emplace(CompactKey(key), std::move(cell));
    }
  }

  size_t size() const { return compact_ ? packed_.size() : lines_.size(); }
  // Whether the keys are in packed slots.
  bool packed() const { return compact_; }

  // Calls f(map) with the layout in use (absl::flat_hash_set<LineEntry> or
  // absl::flat_hash_map<CompactKey, Cell>); f reads entries through KeyOf
  // and CellOf, and may erase. In a write section.
  template <typename F>
  decltype(auto) Visit(F&& f) {
    return compact_ ? f(packed_) : f(lines_);
  }
  static std::string_view KeyOf(const LineEntry& e) { return e.key.view(); }
  static std::string_view KeyOf(const PackedEntry& e) { return e.first.view(); }
  static Cell& CellOf(const LineEntry& e) { return e.cell; }
  static Cell& CellOf(PackedEntry& e) { return e.second; }

 private:
  // The stored key of an entry (moved from only by MoveAll), and a
  // lookup's key as it is: KeyHash and KeyEq then serve the lines too.
  static CompactKey& Key(const LineEntry& e) { return const_cast<CompactKey&>(e.key); }
  static CompactKey& Key(const PackedEntry& e) { return const_cast<CompactKey&>(e.first); }
  static std::string_view Key(std::string_view key) { return key; }
  struct LineHash {
    using is_transparent = void;
    template <typename K>
    size_t operator()(const K& k) const {
      return KeyHash{}(Key(k));
    }
  };
  struct LineEq {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return KeyEq{}(Key(a), Key(b));
    }
  };
  using PackedMap = absl::flat_hash_map<CompactKey, Cell, KeyHash, KeyEq>;
  using LineSet = absl::flat_hash_set<LineEntry, LineHash, LineEq>;

  // Moves every key and cell of `from` into `to`, and frees `from`'s table.
  template <typename From, typename To>
  static void MoveAll(From& from, To& to) {
    for (auto& e : from) to.emplace(std::move(Key(e)), std::move(CellOf(e)));
    From().swap(from);  // destroys the moved-from entries
  }

  // Room in lines for `keys` keys with every slot beside an empty one on
  // average: a full table of lines (7/8, absl's most) cost two threads
  // 10-15% of their decisions (bench/README.md, "Keys of their own
  // lines"). A core's prefetcher fetches the lines after the ones a
  // decision reads, and a slot in use there is likely the other thread's
  // (the likely reason; not measured apart).
  void LinesFor(size_t keys) { lines_.reserve(2 * keys + 1); }

  // Moves every key to packed slots, for good, and frees the lines.
  void Pack() {
    packed_.reserve(lines_.size() + 1);
    MoveAll(lines_, packed_);
    compact_ = true;
  }

  bool compact_ = true;
  bool unpacked_ = false;  // moved to lines once: never again
  // The packed map's header first, in the line compact_ is in: the path of
  // a decision over many keys reads one line of the shard's.
  PackedMap packed_;
  LineSet lines_;
};

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_SHARD_MAP_H_
