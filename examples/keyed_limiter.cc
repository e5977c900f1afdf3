// A keyed limiter in a few lines: 10 requests per second per user, bursts
// of up to 5, state in this process.
#include <cstdio>

#include "sluice/limiter.h"
#include "sluice/store/memory_store.h"

int main() {
  sluice::MemoryStore store;
  auto limiter = sluice::Limiter::Create(store, {.name = "api",
                                                 .limits = {{.algorithm = sluice::Algorithm::kGcra,
                                                             .rate = *sluice::ParseRate("10/s"),
                                                             .burst = 5}}});
  if (!limiter.ok()) {
    std::fprintf(stderr, "%s\n", std::string(limiter.status().message()).c_str());
    return 1;
  }
  for (int i = 0; i < 25; ++i) {
    const char* user = i % 3 == 0 ? "bob" : "alice";
    absl::StatusOr<sluice::PolicyDecision> d = (*limiter)->Acquire(user);
    if (!d.ok()) return 1;
    if (d->allowed) {
      std::printf("%-5s allowed, %lld left\n", user, static_cast<long long>(d->remaining));
    } else {
      std::printf("%-5s denied, retry in %lld ms\n", user,
                  static_cast<long long>(d->retry_after.CeilMillis()));
    }
  }
  return 0;
}
