// Uses the installed headers and libraries: a keyed limiter on the memory
// store. Exits 0 only if the limiter behaves as documented.
#include <cstdio>

#include "sluice/clock.h"
#include "sluice/limiter.h"
#include "sluice/store/memory_store.h"

int main() {
  sluice::MemoryStore store;
  sluice::ManualClock clock(sluice::Time::FromUnixMicros(1'700'000'000'000'000));
  auto limiter = sluice::Limiter::Create(store, {.name = "api",
                                                 .limits = {{.algorithm = sluice::Algorithm::kGcra,
                                                             .rate = *sluice::ParseRate("10/s"),
                                                             .burst = 2}},
                                                 .clock = &clock});
  if (!limiter.ok()) return 1;
  const bool first = (*limiter)->Acquire("k")->allowed;
  const bool second = (*limiter)->Acquire("k")->allowed;
  const bool third = (*limiter)->Acquire("k")->allowed;
  std::printf("consumer: %d %d %d\n", first, second, third);
  return first && second && !third ? 0 : 1;
}
