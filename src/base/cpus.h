#pragma once

#include <vector>

namespace sluice {

// The CPUs this process may run on (sched_getaffinity: a cpuset or taskset
// narrows them), in order; empty when unknown.
std::vector<int> AllowedCpus();

// How many: AllowedCpus(), or where unknown the machine's, at least 1.
int UsableCpus();

}  // namespace sluice
