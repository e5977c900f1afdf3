// sluice/algorithm/concurrency.h: at most `limit` requests of a key in
// flight at once.
//
// A request that is admitted holds `cost` slots (1 for a request) until it
// is released (Refund with the time it was admitted) or until `lease_ttl`
// has passed since then, whichever comes first: a holder that dies without
// releasing (a crashed instance, a client that went away) gives its slots
// back when their lease ends, with nobody's help.
//
// The state is the sliding log's (window.h) with the lease TTL as its
// period: one entry per admitted instant, an entry leaving the log when its
// lease ends. Exact: at no instant do the held slots exceed the limit. A
// denial's retry_after is when enough of the oldest leases end for the
// request to fit: the latest it can be (an earlier release frees a slot
// sooner), so a denial is never certain until then (a shared store must not
// answer it from a cache). reset_after is when the newest lease ends.
//
// Slots are named: a request holds its slots in an entry of its own,
// carrying a name its holder chose (Hold; the Limiter draws a random one
// per decision), and gives them back or renews them by that name (Release,
// Renew). A second release finds nothing and gives back nothing, never
// another request's slot. (Decide and Refund, the sliding log's, count
// slots instead: a refund takes from whichever entry is at or after its
// time.)
//
//   auto config = sluice::ConcurrencyConfig::Create({.limit = 10});
//   sluice::SlidingLogState state;
//   sluice::Decision d = sluice::Hold(*config, state, now, 1, slot);  // holds a slot
//   sluice::Release(*config, state, now, slot);                      // gives it back
#ifndef SLUICE_ALGORITHM_CONCURRENCY_H_
#define SLUICE_ALGORITHM_CONCURRENCY_H_

#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "sluice/algorithm/window.h"
#include "sluice/time.h"

namespace sluice {

// The lease of a slot when none is configured: longer than the gateway's
// default upstream timeout (30 s), so a slow answer keeps its slot.
inline constexpr Duration kDefaultLeaseTtl = Duration::Seconds(60);
inline constexpr Duration kMinLeaseTtl = Duration::Millis(100);
inline constexpr Duration kMaxLeaseTtl = Duration::Days(1);

struct ConcurrencyOptions {
  int64_t limit = 0;  // 1 .. kMaxSlidingLogLimit slots
  Duration lease_ttl = kDefaultLeaseTtl;
};

// How long requests held their slots: a moving average of the holds seen
// (an eighth of each new one), zero before the first. A concurrency
// denial's retry_after is the longest a slot can still be held (its lease);
// a typical hold ends much sooner, and Cap says so. Thread-safe (relaxed: a
// lost update under contention drops one sample of an average).
class HoldAverage {
 public:
  void Observe(Duration hold);
  Duration value() const { return Duration::Micros(us_.load(std::memory_order_relaxed)); }
  // `retry_after` (a denial's lease bound), at most the average once there is one.
  Duration Cap(Duration retry_after) const;

 private:
  std::atomic<int64_t> us_{0};
};

// Decide, Check, Refund and FreshAt are the sliding log's (window.h): a
// concurrency limit is a log whose entries live for the lease TTL.
struct ConcurrencyConfig : SlidingLogConfig {
  static absl::StatusOr<ConcurrencyConfig> Create(const ConcurrencyOptions& options);
  Duration lease_ttl() const { return period(); }
};

// Decide, the slots taken (when allowed and cost > 0) in an entry named
// `slot` (not 0), which joins no other.
Decision Hold(const ConcurrencyConfig& config, SlidingLogState& state, Time now, int64_t cost,
              uint64_t slot);
// Gives back the slots named `slot`, held since `taken_at` or later, if they
// are still held: whether they were (false: given back already, or their
// lease ended).
bool Release(const ConcurrencyConfig& config, SlidingLogState& state, Time taken_at, uint64_t slot);
// Release and Hold at `now` in one step: the slots named `slot` keep their
// name and their lease starts again. Slots no longer held are not taken
// afresh: denied, with Check's answer otherwise.
Decision Renew(const ConcurrencyConfig& config, SlidingLogState& state, Time taken_at, Time now,
               int64_t cost, uint64_t slot);

}  // namespace sluice

#endif  // SLUICE_ALGORITHM_CONCURRENCY_H_
