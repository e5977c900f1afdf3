// CompactKey: a byte-string key in 16 bytes. Internal to the memory store.
//
// Keys of up to 15 bytes (IPv4 addresses, short API keys, user ids) live
// inline: 15 bytes of data and a length byte. Longer keys keep a pointer and
// a length and own a heap copy. This halves a slot against std::string
// (32 bytes) and is what keeps one-word algorithms under 64 bytes per key.
#ifndef SLUICE_STORE_MEMORY_COMPACT_KEY_H_
#define SLUICE_STORE_MEMORY_COMPACT_KEY_H_

#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace sluice::internal {

class CompactKey {
 public:
  static constexpr size_t kInlineMax = 15;

  explicit CompactKey(std::string_view key) {
    if (key.size() <= kInlineMax) {
      std::memcpy(raw_, key.data(), key.size());
      raw_[kTag] = static_cast<unsigned char>(key.size());
    } else {
      char* copy = new char[key.size()];
      std::memcpy(copy, key.data(), key.size());
      const uint64_t size = key.size();
      std::memcpy(raw_, &copy, sizeof copy);
      std::memcpy(raw_ + 8, &size, 7);  // sizes are < 2^56
      raw_[kTag] = kHeapTag;
    }
  }
  CompactKey(const CompactKey& other) : CompactKey(other.view()) {}
  CompactKey(CompactKey&& other) noexcept {
    std::memcpy(raw_, other.raw_, sizeof raw_);
    other.raw_[kTag] = 0;  // the source becomes the empty inline key
  }
  CompactKey& operator=(CompactKey other) noexcept {
    Release();
    std::memcpy(raw_, other.raw_, sizeof raw_);
    other.raw_[kTag] = 0;
    return *this;
  }
  ~CompactKey() { Release(); }

  std::string_view view() const {
    if (raw_[kTag] != kHeapTag) {
      return {reinterpret_cast<const char*>(raw_), raw_[kTag]};
    }
    const char* ptr;
    uint64_t size = 0;
    std::memcpy(&ptr, raw_, sizeof ptr);
    std::memcpy(&size, raw_ + 8, 7);
    return {ptr, size};
  }
  // Whether this is `key`. An inline key is compared in place, with at
  // most two loads from each side (its first and last eight bytes, or four,
  // overlapping), not through memcmp.
  bool Equals(std::string_view key) const {
    const unsigned char tag = raw_[kTag];
    if (tag == kHeapTag) return view() == key;
    const size_t n = key.size();
    if (tag != n) return false;
    const char* k = key.data();
    if (n >= 8)
      return Load<uint64_t>(raw_) == Load<uint64_t>(k) &&
             Load<uint64_t>(raw_ + n - 8) == Load<uint64_t>(k + n - 8);
    if (n >= 4)
      return Load<uint32_t>(raw_) == Load<uint32_t>(k) &&
             Load<uint32_t>(raw_ + n - 4) == Load<uint32_t>(k + n - 4);
    for (size_t i = 0; i < n; ++i) {
      if (raw_[i] != static_cast<unsigned char>(k[i])) return false;
    }
    return true;
  }
  // Bytes held outside the object.
  size_t heap_bytes() const { return raw_[kTag] == kHeapTag ? view().size() : 0; }

 private:
  static constexpr size_t kTag = 15;
  template <typename T>
  static T Load(const void* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static constexpr unsigned char kHeapTag = 0xFF;

  void Release() {
    if (raw_[kTag] == kHeapTag) {
      char* ptr;
      std::memcpy(&ptr, raw_, sizeof ptr);
      delete[] ptr;
      raw_[kTag] = 0;
    }
  }

  alignas(8) unsigned char raw_[16] = {};
};

static_assert(sizeof(CompactKey) == 16);

// Transparent hash and equality, so lookups take a std::string_view without
// building a key.
struct KeyHash {
  using is_transparent = void;
  // A key of 4 to 16 bytes is hashed inline from two loads that together
  // cover every byte (its first and last eight bytes, or four) and its
  // length, through absl's seeded mix; a longer or shorter one as absl
  // hashes a string, out of line. Over 100k keys the inline hash took about
  // 6% off a decision (bench/README.md, "A key compared and hashed in
  // place").
  size_t operator()(std::string_view key) const {
    const size_t n = key.size();
    const char* k = key.data();
    if (n >= 8 && n <= 16) {
      uint64_t first, last;
      std::memcpy(&first, k, 8);
      std::memcpy(&last, k + n - 8, 8);
      return absl::HashOf(first, last, n);
    }
    if (n >= 4 && n < 8) {
      uint32_t first, last;
      std::memcpy(&first, k, 4);
      std::memcpy(&last, k + n - 4, 4);
      return absl::HashOf(first, last, n);
    }
    return absl::Hash<absl::string_view>{}(absl::string_view(k, n));
  }
  size_t operator()(const CompactKey& key) const { return (*this)(key.view()); }
};

struct KeyEq {
  using is_transparent = void;
  static std::string_view View(std::string_view key) { return key; }
  static std::string_view View(const CompactKey& key) { return key.view(); }
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return View(a) == View(b);
  }
  // A lookup's key against a stored one: compared in place (Equals).
  bool operator()(const CompactKey& a, std::string_view b) const { return a.Equals(b); }
  bool operator()(std::string_view a, const CompactKey& b) const { return b.Equals(a); }
};

}  // namespace sluice::internal

#endif  // SLUICE_STORE_MEMORY_COMPACT_KEY_H_
