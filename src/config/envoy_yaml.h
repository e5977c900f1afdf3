// The part of the envoy rules reader that the main config loader calls:
// `envoy:` and `envoy_files:` of a sluice config. Internal to sluice::config.
#ifndef SLUICE_CONFIG_ENVOY_YAML_H_
#define SLUICE_CONFIG_ENVOY_YAML_H_

#include <memory>
#include <optional>
#include <string>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"
#include "config/yaml_text.h"
#include "sluice/envoy_config.h"

namespace sluice::internal {

// Reads `envoy` (a list of domains) and `envoy_files` (a list of paths,
// relative to the directory of `source`); either may be absent. Each file
// is read and its errors name the file itself. A domain may appear only
// once across all of them.
absl::StatusOr<std::shared_ptr<EnvoyConfig>> ReadEnvoySection(
    const std::string& source, const std::optional<YamlAt>& envoy,
    const std::optional<YamlAt>& envoy_files, const EnvoyParseOptions& options);

}  // namespace sluice::internal

#endif  // SLUICE_CONFIG_ENVOY_YAML_H_
