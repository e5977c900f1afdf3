#include "server/setup.h"

#include <sched.h>

#include <vector>

#include <gtest/gtest.h>

#include "base/cpus.h"

namespace sluice::server {
namespace {

std::vector<int> Allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// `threads: 0` is a loop for each CPU the process may run on, which the
// server and the gRPC listener both take from ServerConfig::Loops.
TEST(ServerConfigLoops, ThreadsOrOnePerAllowedCpu) {
  const int n = static_cast<int>(Allowed().size());
  EXPECT_EQ(ServerConfig{}.Loops(), n);
  EXPECT_EQ(ServerConfig{.threads = 3}.Loops(), 3);
}

// Threads are kept on CPUs only by a process that has one for each CPU it
// may run on: two instances with fewer threads each would otherwise keep
// theirs on the same first CPUs.
TEST(LoopCpus, OnlyAThreadForEachAllowedCpuKeepsThem) {
  const std::vector<int> allowed = Allowed();
  const int n = static_cast<int>(allowed.size());
  EXPECT_EQ(UsableCpus(), n);
  ServerConfig on;
  on.cpu_affinity = true;
  const ServerConfig off;
  if (n >= 2) {
    EXPECT_EQ(LoopCpus(on, n), allowed);
  } else {
    EXPECT_TRUE(LoopCpus(on, n).empty()) << "one loop has nothing to steer";
  }
  EXPECT_TRUE(LoopCpus(off, n).empty());
  EXPECT_TRUE(LoopCpus(on, n + 1).empty());
  if (n >= 3) EXPECT_TRUE(LoopCpus(on, n - 1).empty());
  EXPECT_TRUE(LoopCpus(on, 1).empty());
}

}  // namespace
}  // namespace sluice::server
