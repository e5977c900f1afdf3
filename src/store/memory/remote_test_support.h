// Test support: a store in another process, as Redis is to sluice, made of
// a memory store, for tests of what a remote store's callers do (its
// errors, its answers on a thread of its own). Tests derive from it and
// override DecideBatch.
#ifndef SLUICE_STORE_MEMORY_REMOTE_TEST_SUPPORT_H_
#define SLUICE_STORE_MEMORY_REMOTE_TEST_SUPPORT_H_

#include <memory>

#include "sluice/store/memory_store.h"
#include "sluice/store/store.h"

namespace sluice {

class RemoteOverMemory : public Store {
 public:
  absl::StatusOr<std::shared_ptr<LimitTable>> OpenTable(const LimitConfig& config) override {
    return inner_.OpenTable(config);
  }
  bool remote() const override { return true; }

 private:
  MemoryStore inner_;
};

}  // namespace sluice

#endif  // SLUICE_STORE_MEMORY_REMOTE_TEST_SUPPORT_H_
