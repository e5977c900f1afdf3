// Fuzz target: a simulator scenario file (sim::ParseScenario), which
// validates every key, rate, duration and bound as it reads. Nothing is
// simulated: a run's cost is what the file asks for (up to two days of
// traffic from millions of clients), which is not a parser's to bound.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sim/scenario_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)sluice::sim::ParseScenario(text, "fuzz.yaml", "fuzz");
  return 0;
}
