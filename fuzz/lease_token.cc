// Fuzz target: the lease tokens of /v1/renew and /v1/release
// (server/lease_token.cc). The input is read twice: as a token's text (the
// signature check must refuse it), and as a payload signed with the fuzzer's
// secret, so that the payload's reading is reached past the signature; what
// decodes must encode back to a token that decodes the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/escaping.h"
#include "server/lease_token.h"

namespace {

constexpr std::string_view kSecret = "the fuzzer's lease secret";

std::string Signed(std::string_view payload) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), kSecret.data(), static_cast<int>(kSecret.size()),
       reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), digest, &length);
  return absl::WebSafeBase64Escape(absl::string_view(payload.data(), payload.size())) + "." +
         absl::WebSafeBase64Escape(
             absl::string_view(reinterpret_cast<const char*>(digest), length));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  using sluice::server::DecodeLeaseToken;
  (void)DecodeLeaseToken(input, kSecret);
  const absl::StatusOr<sluice::server::LeaseToken> token = DecodeLeaseToken(Signed(input), kSecret);
  if (!token.ok()) return 0;
  const absl::StatusOr<sluice::server::LeaseToken> again =
      DecodeLeaseToken(sluice::server::EncodeLeaseToken(*token, kSecret), kSecret);
  if (!again.ok() || again->kind != token->kind || again->expires != token->expires ||
      again->policy != token->policy || again->key != token->key || again->cost != token->cost ||
      again->taken_at != token->taken_at || again->store_time != token->store_time ||
      again->store_error != token->store_error || again->slot != token->slot) {
    std::abort();
  }
  return 0;
}
