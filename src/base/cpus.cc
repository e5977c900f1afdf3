#include "base/cpus.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace sluice {

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

int UsableCpus() {
  const size_t allowed = AllowedCpus().size();
  if (allowed > 0) return static_cast<int>(allowed);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace sluice
