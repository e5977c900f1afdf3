// The reservations of settled costs this process gave and that are not
// settled yet (docs/settled-costs.md): a reservation id is settled at most
// once, and only before it expires. Reservation ids are signed with this
// process' own random secret, so no other process can settle them and
// this one's record is the whole truth. Bounded: it keeps up to
// kMaxReservations open, and past that forgets the oldest open one first
// (its estimate stays its cost). So reservations never settled, a
// caller's or a flood's, cost the others nothing until 2^18 of them are
// open at once, and a reservation settled late (a long request's) is kept
// however many were given and settled since. Thread-safe.
#ifndef SLUICE_SERVER_RESERVATIONS_H_
#define SLUICE_SERVER_RESERVATIONS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
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
  // Records the reservation signed `signature` (TokenSignature), to be
  // settled before `expires`; the oldest open one is forgotten when `max`
  // are open.
  void Add(std::string_view signature, Time expires, Time now);
  // Whether the reservation signed `signature` was kept and not expired at
  // `now`; it is not any more.
  bool Take(std::string_view signature, Time now);

 private:
  // A signature's first 16 characters, 96 bits of its HMAC: enough to tell
  // 2^18 apart, and nobody without the secret can choose them.
  using Key = std::array<char, 16>;
  struct Given {
    Key key;
    Time expires;
  };
  static Key KeyOf(std::string_view signature);
  bool IsOpen(const Given& given) const;
  // Drops the oldest given from the order, and from the open ones if it
  // was open (then true). REQUIRES: one is given.
  bool PopOldest();
  // Forgets the oldest open one; the ones that expired by `now`.
  void ForgetOldestOpen();
  void DropExpired(Time now);

  const size_t max_;
  std::mutex mu_;
  std::deque<Given> given_;  // in the order given, some settled ones too
  absl::flat_hash_map<Key, Time> open_;
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
