// sluice/store/store.h: where the state of a limit's keys lives.
//
// A `Store` opens one `LimitTable` per limit; the table maps keys (arbitrary
// byte strings of at most kMaxKeyLength bytes) to that limit's state and
// runs the limit's algorithm on it. The memory store (memory_store.h) keeps
// the state in this process; other stores keep it elsewhere behind the same
// interface.
//
// Thread-safety: every method of Store and LimitTable may be called from any
// number of threads at once.
//
//   sluice::MemoryStore store;
//   auto table = store.OpenTable(*sluice::MakeLimit({.algorithm = sluice::Algorithm::kGcra,
//                                                    .rate = *sluice::ParseRate("10/s")}));
//   absl::StatusOr<sluice::Decision> d = (*table)->Decide("user-1", clock.Now(), 1);
#ifndef SLUICE_STORE_STORE_H_
#define SLUICE_STORE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/algorithm.h"
#include "sluice/decision.h"
#include "sluice/time.h"

namespace sluice {

// Longest key a store accepts, in bytes. Longer keys are rejected with
// InvalidArgument, never truncated (two keys must never share a bucket).
inline constexpr size_t kMaxKeyLength = 1024;

// OK, or InvalidArgument naming the length and the maximum.
absl::Status ValidateKey(std::string_view key);

class LimitTable {
 public:
  virtual ~LimitTable() = default;

  // Runs the limit for `key` at `now`, taking `cost` when allowed.
  // REQUIRES: cost >= 0. Errors: InvalidArgument for a key that is too long;
  // stores with I/O also Unavailable / DeadlineExceeded.
  virtual absl::StatusOr<Decision> Decide(std::string_view key, Time now, int64_t cost) = 0;

  // What Decide would answer, without taking anything or creating the key.
  // Check(key, now, 0) reads a key's state ("why was I limited").
  virtual absl::StatusOr<Decision> Check(std::string_view key, Time now, int64_t cost) = 0;

  // Gives back `cost` that Decide took at `taken_at` (a later limit of the
  // same request denied it: all-or-nothing).
  virtual absl::Status Refund(std::string_view key, Time taken_at, int64_t cost) = 0;

  virtual const LimitConfig& config() const = 0;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual absl::StatusOr<std::shared_ptr<LimitTable>> OpenTable(const LimitConfig& config) = 0;
};

}  // namespace sluice

#endif  // SLUICE_STORE_STORE_H_
