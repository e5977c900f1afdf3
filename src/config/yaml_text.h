// The text under sluice's YAML reader (yaml_reader.h): reading a file with
// a size cap, loading its documents, and the pieces of an error message
// that names the file, the line and the key. Internal to sluice::config.
//
//   absl::StatusOr<std::string> text = internal::ReadTextFile(path, internal::kMaxYamlBytes);
//   // "scenario.yaml:12: clients[0].rate: ..."
#ifndef SLUICE_CONFIG_YAML_TEXT_H_
#define SLUICE_CONFIG_YAML_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"

namespace sluice::internal {

// A node and where it sits: its dotted path ("policies[0].limits[1]") and
// its 1-based line.
struct YamlAt {
  YAML::Node node;
  std::string path;
  int line = 1;
};

// The whole file. Errors: "<path>: cannot read: <reason>", also for a file
// larger than `max_bytes`.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes);

// A path a config file names: as given when absolute, else relative to the
// folder of `source` (the config file's own path).
std::string PathBeside(std::string_view source, const std::string& given);

// yaml-cpp's LoadAll, which never returns for some text: after a document
// that ends before a stray token (",\n", "- a\n,"), its parser starts the
// next document at that token without consuming it, and LoadAll collects
// the same empty document until memory runs out. Here that token is a
// YAML::ParserException ("unexpected ','") at its place, as other syntax
// errors are. yaml-cpp also takes a quote that is never closed for a value
// running to the end of the text; that too is a YAML::ParserException, at
// the quote. The text is read twice (once to find where documents start and
// which quotes close).
std::vector<YAML::Node> LoadAllDocuments(std::string_view yaml);

// The node's 1-based line, or `fallback` when yaml-cpp has no mark for it.
int LineOf(const YAML::Node& node, int fallback);

// "a.b" from "a" and "b"; "b" at the top.
std::string JoinPath(std::string_view path, std::string_view key);

// What an error says was found: "\"text\"", "a list", "a map", "nothing".
std::string DescribeNode(const YAML::Node& node);

}  // namespace sluice::internal

#endif  // SLUICE_CONFIG_YAML_TEXT_H_
