// Tokens of the decision API: leases (POST /v1/acquire, /v1/renew,
// /v1/release; docs/concurrency.md) and reservations (POST /v1/check with
// "settle", then /v1/settle; docs/settled-costs.md). What a release or a
// settle needs (the policy, key, cost and when it was taken), as one
// opaque string signed with a server secret (HMAC-SHA256), so that a caller
// cannot release or settle what it was never given, nor more of it.
//
// The token is "<payload>.<mac>", both base64url without padding; the
// payload is "kind cost taken_at_us store_time_us store_error expires_us
// slot policy_length " followed by the policy's name and the key. Pure
// functions, fuzzed.
#ifndef SLUICE_SERVER_LEASE_TOKEN_H_
#define SLUICE_SERVER_LEASE_TOKEN_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "sluice/limiter.h"

namespace sluice::server {

struct LeaseToken {
  // (The payload gained the slot: the 'l' and 'r' of versions before it
  // are not read.)
  enum class Kind : char { kLease = 's', kReservation = 't' };
  Kind kind = Kind::kLease;
  Time expires;  // a reservation's end (its estimate stays, unsettled, after it)
  std::string policy;
  std::string key;
  int64_t cost = 1;
  Time taken_at;    // by the server's clock
  Time store_time;  // by the store's (Redis' TIME, or taken_at)
  bool store_error = false;
  uint64_t slot = 0;  // a lease's: the name its slots are held under (PolicyDecision::slot)

  // What Limiter::Release and RenewAsync need of the decision that took.
  PolicyDecision Taken() const;
};

// The longest token read: a policy name and a key of kMaxKeyLength bytes
// fit with room to spare.
inline constexpr size_t kMaxLeaseTokenLength = 4096;

std::string EncodeLeaseToken(const LeaseToken& token, std::string_view secret);
// A token's signature (the text after its '.'): what tells tokens apart in
// the records of what was settled or given back.
inline std::string_view TokenSignature(std::string_view token) {
  return token.substr(token.find('.') + 1);
}
// InvalidArgument for anything but a token this secret signed.
absl::StatusOr<LeaseToken> DecodeLeaseToken(std::string_view text, std::string_view secret);

// 32 random bytes (the server's secret when the config gives none).
std::string RandomLeaseSecret();

}  // namespace sluice::server

#endif  // SLUICE_SERVER_LEASE_TOKEN_H_
