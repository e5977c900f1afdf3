// ShardMap: one shard's keys and their cells, in one of two layouts.
// Internal to the memory store.
//
// Why two: a table slot of a key (16 bytes) and a one-word cell (8) is 24
// bytes, so a cache line holds parts of two or three keys. When threads
// write the states of different keys that share a line, each write takes
// the line from the other core: two threads deciding on 1,000 keys each,
// every decision passing, made no more decisions than one
// (BM_StoreDistinctKeys, bench/README.md, "Keys of their own lines"). A
// small shard therefore gives each key two lines of its own (LineEntry, 128
// bytes, the pair of lines a core's prefetcher fetches together): its key,
// which only inserts write, and its cell, which decisions write. With the
// key and the cell in one line of the pair, two threads made 1.4-1.5x one;
// apart, 1.65-1.8x. A shard that grows past kLineKeysMax keys moves them
// all to packed slots, for good (a fifth of the memory a slot), where a line
// written by two cores costs less: over many keys a line is seldom still in
// the other core's cache. So does a shard that gains a key while its store
// holds kLineStoreKeysMax keys or more: however many tables a store has,
// its keys in lines of their own stay about that many (a few MiB). Cells
// larger than a line are always packed.
//
// What `compact_` says changes only in a write section (ShardGate), so a
// reader sees one layout for its whole section, and a cell a reader holds
// stays where it is until the section ends.
#ifndef SLUICE_STORE_MEMORY_SHARD_MAP_H_
#define SLUICE_STORE_MEMORY_SHARD_MAP_H_

#include <cstddef>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "store/memory/compact_key.h"

namespace sluice::internal {

template <typename Cell>
class ShardMap {
 public:
  // The most keys a shard keeps in lines of their own: 96 fit the 127
  // slots of a 16 KiB table; with 64 shards, 6,144 keys and 1 MiB a table.
  static constexpr size_t kLineKeysMax = 96;
  // The most keys a store holds before its shards pack as they gain keys.
  static constexpr int64_t kLineStoreKeysMax = 32'768;

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
    if (compact_) [[likely]] {  // laid out as the fall-through: many keys, memory-bound
      auto it = packed_.find(key, hash);
      return it == packed_.end() ? nullptr : &it->second;
    }
    auto it = lines_.find(key, hash);
    return it == lines_.end() ? nullptr : &it->cell;
  }

  // Adds `key`, which the map does not hold, to a store that holds
  // `store_keys` keys. In a write section.
  void Insert(std::string_view key, Cell cell, int64_t store_keys) {
    if (!compact_ && (lines_.size() >= kLineKeysMax || store_keys >= kLineStoreKeysMax)) Pack();
    if (compact_) {
      packed_.emplace(CompactKey(key), std::move(cell));
    } else {
      lines_.emplace(CompactKey(key), std::move(cell));
    }
  }

  size_t size() const { return compact_ ? packed_.size() : lines_.size(); }
  // Whether the keys are in packed slots (for good).
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
  struct LineHash {
    using is_transparent = void;
    size_t operator()(std::string_view key) const { return KeyHash{}(key); }
    size_t operator()(const LineEntry& e) const { return KeyHash{}(e.key); }
  };
  struct LineEq {
    using is_transparent = void;
    bool operator()(const LineEntry& a, const LineEntry& b) const {
      return a.key.Equals(b.key.view());
    }
    bool operator()(const LineEntry& a, std::string_view b) const { return a.key.Equals(b); }
    bool operator()(std::string_view a, const LineEntry& b) const { return b.key.Equals(a); }
  };

  // Moves every key to packed slots, for good, and frees the lines.
  void Pack() {
    packed_.reserve(lines_.size() + 1);
    for (const LineEntry& e : lines_) {
      LineEntry& moved = const_cast<LineEntry&>(e);  // destroyed just below
      packed_.emplace(std::move(moved.key), std::move(moved.cell));
    }
    absl::flat_hash_set<LineEntry, LineHash, LineEq>().swap(lines_);
    compact_ = true;
  }

  // A cell larger than a line (the sliding log's, 104 bytes, a list beside
  // it) is packed from the start: a pair of lines would not hold it.
  bool compact_ = sizeof(Cell) > 64;
  // The packed map's header first, in the line compact_ is in: the path of
  // a decision over many keys reads one line of the shard's.
  absl::flat_hash_map<CompactKey, Cell, KeyHash, KeyEq> packed_;
  absl::flat_hash_set<LineEntry, LineHash, LineEq> lines_;
};

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_SHARD_MAP_H_
