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
#include <mutex>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
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

}  // namespace sluice::server

#endif  // SLUICE_SERVER_RESERVATIONS_H_
