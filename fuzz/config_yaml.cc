// Fuzz target: a sluice config file (sluice::ParseConfig): YAML, then every
// section's keys, values, rates, addresses and cross-checks, including the
// Envoy rules written inline (`envoy:`).
//
// The files `envoy_files:` and `store.redis.tls` name are read, relative to
// the directory the target runs in (the text is "fuzz.yaml"); run it where
// that is harmless.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sluice/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)sluice::ParseConfig(text, "fuzz.yaml");
  return 0;
}
