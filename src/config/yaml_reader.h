// The one YAML reader of sluice's three file formats: the serve config
// (config.cc), envoyproxy/ratelimit files (envoy_config.cc) and simulator
// scenarios (sim/scenario_file.cc). Each format's reader derives from
// YamlReader and keeps only what is its own; the nodes, the keys of a map,
// integers, durations, names and the keys of one limit are read here, with
// one wording for each mistake and the bounds below. Internal to
// sluice::config.
//
// Every error is "<source>:<line>: <path>: <message>", the first one found;
// the line of an empty value (`key:`) is its key's. Readers return the value
// or the error; an absent optional key is the caller's to default.
//
// Thread-safety: a YamlReader holds only its source name; reading is const.
//
//   internal::YamlReader reader("gateway.yaml");
//   absl::StatusOr<int64_t> threads = reader.ReadInt(at, 0, 256);
//   // "gateway.yaml:3: server.threads: must be from 0 to 256, got 300"
#ifndef SLUICE_CONFIG_YAML_READER_H_
#define SLUICE_CONFIG_YAML_READER_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/yaml_text.h"
#include "sluice/algorithm.h"
#include "sluice/config.h"
#include "sluice/rate.h"
#include "sluice/time.h"

// Within the readers: return the error of a Status, else go on.
#define SLUICE_RETURN_IF_ERROR(expr)                                  \
  do {                                                                \
    if (absl::Status status_ = (expr); !status_.ok()) return status_; \
  } while (0)

// Within the readers: return the error of a StatusOr, else assign its value
// to `lhs` (which may declare a variable). It expands to several
// statements: brace it under an `if`.
#define SLUICE_ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(SLUICE_YAML_CONCAT_(status_or_, __LINE__), lhs, expr)
#define SLUICE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = *std::move(tmp)
#define SLUICE_YAML_CONCAT_(a, b) SLUICE_YAML_CONCAT_IMPL_(a, b)
#define SLUICE_YAML_CONCAT_IMPL_(a, b) a##b

namespace sluice::internal {

// The bounds of every file sluice reads, each the same in all three formats
// (docs/configuration.md, "Bounds", documents them).
//
// Far beyond any real config, rule or scenario file.
inline constexpr size_t kMaxYamlBytes = size_t{16} << 20;
// A name: of a policy or route, of a scenario, its client groups and
// limiters, of an envoy rule. Names go into HTTP headers, metrics, tables
// and plots.
inline constexpr size_t kMaxNameLength = 128;
// An envoy domain, descriptor key or value: not a name sluice shows but text
// matched against what Envoy sends, as envoyproxy/ratelimit reads it.
inline constexpr size_t kMaxDescriptorTextLength = 256;
// A bucket holds at most what a rate may admit in one period (kMaxLimit,
// 2^40), and a shaping queue waits for at most that much cost.
inline constexpr int64_t kMaxBurst = kMaxLimit;
inline constexpr int64_t kMaxQueue = kMaxLimit;

// What a name may hold besides its length, by where it is shown.
enum class NameChars {
  kToken,  // letters, digits, '_', '.', '-': the serve config's (HTTP headers, metrics)
  kLabel,  // printable ASCII but ',' and '"': a scenario's (tables, CSV, plots)
  kText,   // anything but control characters: an envoy rule's, as envoyproxy/ratelimit reads it
};

// The range of a duration. A minimum of 1us, the shortest positive
// duration, is reported as "must be longer than 0".
struct DurationBounds {
  Duration min = Duration::Zero();
  Duration max = Duration::Infinite();
};
inline constexpr Duration kPositive = Duration::Micros(1);

// Where the state of a limit can live.
struct ScopeOptions {
  bool shared_store = false;  // store.redis is configured
};

template <typename T>
struct Choice {
  std::string_view name;
  T value;
};

// The entries of one map, each checked against the keys allowed there.
class YamlFields {
 public:
  // Null when the map does not have `key`.
  const YamlAt* Find(std::string_view key) const;
  // Where a missing required key would have been: the map's own line.
  YamlAt Missing(std::string_view key) const;
  // The map itself.
  const YamlAt& self() const { return self_; }

 private:
  friend class YamlReader;
  struct Entry {
    std::string name;
    int key_line = 1;
    YamlAt value;
  };
  YamlAt self_;
  std::vector<Entry> entries_;
};

class YamlReader {
 public:
  using Fields = YamlFields;
  // A key a format knows and sluice does not implement: refused by name,
  // with the reason, never taken for a typo.
  struct Unsupported {
    std::string_view key;
    std::string_view why;
  };

  // `source` names the file in every message.
  explicit YamlReader(std::string source) : source_(std::move(source)) {}

  const std::string& source() const { return source_; }

  // "<source>:<line>: <path>: <message>" ("<source>:<line>: <message>" at
  // the top): the text of an error, or of a warning.
  std::string Locate(const YamlAt& at, std::string_view message) const;
  absl::Status Fail(const YamlAt& at, std::string_view message) const;
  // An error from a lower layer (ParseRate, MakeLimit, ...) placed at `at`.
  absl::Status Fail(const YamlAt& at, const absl::Status& status) const;

  // The one document of `yaml`; nullopt when it holds none (empty, or only
  // comments). `file` names the format in the error for a second document
  // ("a config file"). YAML that does not parse is
  // "<source>:<line>:<column>: <yaml-cpp's message>".
  absl::StatusOr<std::optional<YamlAt>> ReadDocument(std::string_view yaml,
                                                     std::string_view file) const;

  // A map whose keys are all `allowed`; `what` says what was expected
  // ("a map of keys"). Nothing (`server:`) is an empty map: all defaults.
  // A duplicate key, an unknown one and an `unsupported` one are errors.
  absl::StatusOr<Fields> ReadMap(const YamlAt& v, std::string_view what,
                                 std::initializer_list<std::string_view> allowed,
                                 std::initializer_list<Unsupported> unsupported = {}) const;
  static constexpr std::string_view kMapOfKeys = "a map of keys";
  // The items of a list of `items` ("policies"); nothing is an empty list.
  absl::StatusOr<std::vector<YamlAt>> ReadList(const YamlAt& v, std::string_view items) const;
  // A scalar's text; `expected` names what was wanted when it is not one.
  absl::StatusOr<std::string> ReadScalar(const YamlAt& v, std::string_view expected) const;
  // A scalar read by a lower layer's parser (ParseRate, ParseHostPort,
  // ...), whose error is placed at `v`.
  template <typename Parse>
  auto ReadParsed(const YamlAt& v, std::string_view expected, Parse parse) const
      -> decltype(parse(std::string_view())) {
    absl::StatusOr<std::string> text = ReadScalar(v, expected);
    if (!text.ok()) return text.status();
    auto parsed = parse(*text);
    if (!parsed.ok()) return Fail(v, parsed.status());
    return parsed;
  }

  // true/false (and YAML 1.1's yes/no, on/off, y/n), as yaml-cpp reads them.
  absl::StatusOr<bool> ReadBool(const YamlAt& v) const;
  // A decimal integer from `min` to `max`.
  absl::StatusOr<int64_t> ReadInt(const YamlAt& v, int64_t min, int64_t max) const;
  absl::StatusOr<Duration> ReadDuration(const YamlAt& v, DurationBounds bounds = {}) const;
  // The value of one of `choices`, by its name:
  //   ReadChoice<LeakyMode>(v, {{"police", LeakyMode::kPolice}, {"shape", LeakyMode::kShape}})
  template <typename T, size_t N>
  absl::StatusOr<T> ReadChoice(const YamlAt& v, const Choice<T> (&choices)[N]) const {
    std::vector<std::string_view> names;
    for (const Choice<T>& c : choices) names.push_back(c.name);
    absl::StatusOr<size_t> i = ReadChoiceIndex(v, names);
    if (!i.ok()) return i.status();
    return choices[*i].value;
  }
  // 1 to kMaxNameLength characters of `chars`.
  absl::StatusOr<std::string> ReadName(const YamlAt& v, NameChars chars) const;
  // Any text of 1 to `max_bytes` bytes without control characters; `what`
  // as for ReadScalar.
  absl::StatusOr<std::string> ReadText(const YamlAt& v, std::string_view what,
                                       size_t max_bytes) const;

  // The keys of one limit, as the serve config's limits define them
  // (docs/configuration.md#limits) and scenarios and envoy rules reuse them.
  //
  // "100/s", "10/5s": ParseRate's forms.
  absl::StatusOr<Rate> ReadRate(const YamlAt& v) const;
  absl::StatusOr<Algorithm> ReadAlgorithm(const YamlAt& v) const;
  // `rate`, or `limit` + `period`, from a limit's map: one of them is
  // required.
  absl::StatusOr<Rate> ReadLimitRate(const Fields& f) const;
  // algorithm (required), the rate, burst, mode, max_delay and queue. Not
  // yet validated as a whole: MakeLimit does that.
  absl::StatusOr<LimitOptions> ReadLimitOptions(const Fields& f) const;
  absl::StatusOr<LimitOptions> ReadConcurrency(const Fields& f, LimitOptions out) const;
  // `scope` of a serve config limit or an envoy rule: local or global.
  // global needs a shared store, and is the default when there is one.
  absl::StatusOr<Scope> ReadScope(const Fields& f, ScopeOptions options) const;

 private:
  absl::StatusOr<size_t> ReadChoiceIndex(const YamlAt& v,
                                         const std::vector<std::string_view>& names) const;

  std::string source_;
};

}  // namespace sluice::internal

#endif  // SLUICE_CONFIG_YAML_READER_H_
