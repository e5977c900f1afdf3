// The reservations of settled costs this process gave and that are not
// settled yet (docs/settled-costs.md): a reservation id is settled at most
// once, and only before it expires. Reservation ids are signed with this
// process' own random secret, so no other process can settle them and
// this one's record is the whole truth. Bounded: when it holds
// kMaxReservations, no new reservation is given (the check answers
// without one, and its estimate is its cost). Thread-safe.
#ifndef SLUICE_SERVER_RESERVATIONS_H_
#define SLUICE_SERVER_RESERVATIONS_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "sluice/time.h"

namespace sluice::server {

inline constexpr size_t kMaxReservations = 1 << 18;
inline constexpr Duration kReservationTtl = Duration::Hours(1);

class Reservations {
 public:
  explicit Reservations(size_t max = kMaxReservations) : max_(max) {}
  // Records `id`, to be settled before `expires`; false when full (a full
  // record drops its expired reservations at most every 100 ms).
  bool Add(std::string id, Time expires, Time now);
  // Whether `id` was outstanding and not expired at `now`; it is not any more.
  bool Take(std::string_view id, Time now);

 private:
  const size_t max_;
  std::mutex mu_;
  absl::flat_hash_map<std::string, Time> open_;
  Time swept_;  // the last sweep of a full record
};

// The slot names of the leases released lately (PolicyDecision::slot), so
// that a lease's hold feeds its policy's average once: a release sent again
// gives back nothing, and its hold is not a new sample (else a caller
// repeating one release could move the average, which caps Retry-After,
// for every key of the policy). The last kSeenSlots names; the oldest is
// forgotten first. Thread-safe.
inline constexpr size_t kSeenSlots = 4096;

class ReleasedSlots {
 public:
  // Whether `slot` is not among the names seen lately; it is now.
  bool FirstTime(uint64_t slot);

 private:
  std::mutex mu_;
  absl::flat_hash_set<uint64_t> seen_;
  std::vector<uint64_t> order_ = std::vector<uint64_t>(kSeenSlots);  // a ring, 0: empty
  size_t next_ = 0;
};

}  // namespace sluice::server

#endif  // SLUICE_SERVER_RESERVATIONS_H_
