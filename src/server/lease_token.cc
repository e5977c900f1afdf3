#include "server/lease_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <charconv>

#include "absl/strings/escaping.h"
#include "base/cat.h"

namespace sluice::server {
namespace {

using internal::Cat;

std::string Mac(std::string_view payload, std::string_view secret) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), digest, &length);
  return std::string(reinterpret_cast<const char*>(digest), length);
}

absl::Status NotALease(std::string_view why) {
  return absl::InvalidArgumentError(Cat("not a lease or reservation this server gave: ", why));
}

// The next space-terminated integer of `rest`.
template <typename Int>
bool TakeInt(std::string_view& rest, Int& out) {
  const size_t space = rest.find(' ');
  if (space == std::string_view::npos) return false;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + space, out);
  if (ec != std::errc() || end != rest.data() + space) return false;
  rest.remove_prefix(space + 1);
  return true;
}

}  // namespace

PolicyDecision LeaseToken::Taken() const {
  PolicyDecision d;
  d.allowed = true;
  d.taken_at = taken_at;
  d.store_time = store_time;
  d.store_error = store_error;
  d.slot = slot;
  return d;
}

std::string EncodeLeaseToken(const LeaseToken& token, std::string_view secret) {
  const std::string payload =
      Cat(std::string(1, static_cast<char>(token.kind)), " ", token.cost, " ",
          token.taken_at.unix_micros(), " ", token.store_time.unix_micros(), " ",
          token.store_error ? 1 : 0, " ", token.expires.unix_micros(), " ", token.slot, " ",
          token.policy.size(), " ", token.policy, token.key);
  return Cat(absl::WebSafeBase64Escape(absl::string_view(payload.data(), payload.size())), ".",
             absl::WebSafeBase64Escape(Mac(payload, secret)));
}

absl::StatusOr<LeaseToken> DecodeLeaseToken(std::string_view text, std::string_view secret) {
  if (text.size() > kMaxLeaseTokenLength) return NotALease("too long");
  const size_t dot = text.find('.');
  if (dot == std::string_view::npos) return NotALease("no signature");
  std::string payload, mac;
  // (Debian's Abseil has a string_view of its own.)
  if (!absl::WebSafeBase64Unescape(absl::string_view(text.data(), dot), &payload) ||
      !absl::WebSafeBase64Unescape(absl::string_view(text.data() + dot + 1, text.size() - dot - 1),
                                   &mac)) {
    return NotALease("not base64url");
  }
  const std::string want = Mac(payload, secret);
  if (mac.size() != want.size() || CRYPTO_memcmp(mac.data(), want.data(), want.size()) != 0) {
    return NotALease("its signature does not match");
  }
  // Signed by this secret: written by EncodeLeaseToken. Read it as warily.
  std::string_view rest = payload;
  if (rest.size() < 2 || rest[1] != ' ' ||
      (rest[0] != static_cast<char>(LeaseToken::Kind::kLease) &&
       rest[0] != static_cast<char>(LeaseToken::Kind::kReservation))) {
    return NotALease("malformed");
  }
  LeaseToken out;
  out.kind = static_cast<LeaseToken::Kind>(rest[0]);
  rest.remove_prefix(2);
  int64_t cost = 0, taken = 0, store = 0, error = 0, expires = 0, policy_length = 0;
  uint64_t slot = 0;
  if (!TakeInt(rest, cost) || !TakeInt(rest, taken) || !TakeInt(rest, store) ||
      !TakeInt(rest, error) || !TakeInt(rest, expires) || !TakeInt(rest, slot) ||
      !TakeInt(rest, policy_length) || cost < 0 || policy_length < 0 ||
      static_cast<size_t>(policy_length) > rest.size() || (error != 0 && error != 1)) {
    return NotALease("malformed");
  }
  out.expires = Time::FromUnixMicros(expires);
  out.cost = cost;
  out.taken_at = Time::FromUnixMicros(taken);
  out.store_time = Time::FromUnixMicros(store);
  out.store_error = error == 1;
  out.slot = slot;
  out.policy = std::string(rest.substr(0, static_cast<size_t>(policy_length)));
  out.key = std::string(rest.substr(static_cast<size_t>(policy_length)));
  return out;
}

std::string RandomLeaseSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    // Without randomness no secret can be trusted: leases are then refused
    // by every check (an empty secret is never used to sign).
    return std::string();
  }
  return std::string(reinterpret_cast<const char*>(bytes), sizeof bytes);
}

}  // namespace sluice::server
