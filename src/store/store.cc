#include "sluice/store/store.h"

#include "base/cat.h"

namespace sluice {

absl::Status ValidateKey(std::string_view key) {
  if (key.size() > kMaxKeyLength) {
    return absl::InvalidArgumentError(internal::Cat(
        "key of ", key.size(), " bytes is longer than the maximum of ", kMaxKeyLength));
  }
  return absl::OkStatus();
}

}  // namespace sluice
