#include "config/yaml_reader.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include <yaml-cpp/yaml.h>

#include "base/cat.h"

namespace sluice::internal {
namespace {

std::string ListOf(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view name : names) out += Cat(out.empty() ? "" : ", ", name);
  return out;
}

bool HasControlCharacter(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) { return c >= 0 && c < 0x20; });
}

}  // namespace

const YamlAt* YamlFields::Find(std::string_view key) const {
  for (const Entry& entry : entries_) {
    if (entry.name == key) return &entry.value;
  }
  return nullptr;
}

YamlAt YamlFields::Missing(std::string_view key) const {
  return {YAML::Node(), JoinPath(self_.path, key), self_.line};
}

std::string YamlReader::Locate(const YamlAt& at, std::string_view message) const {
  if (at.path.empty()) return Cat(source_, ":", at.line, ": ", message);
  return Cat(source_, ":", at.line, ": ", at.path, ": ", message);
}

absl::Status YamlReader::Fail(const YamlAt& at, std::string_view message) const {
  return absl::InvalidArgumentError(Locate(at, message));
}

absl::Status YamlReader::Fail(const YamlAt& at, const absl::Status& status) const {
  return Fail(at, std::string_view(status.message().data(), status.message().size()));
}

absl::StatusOr<std::optional<YamlAt>> YamlReader::ReadDocument(std::string_view yaml,
                                                               std::string_view file) const {
  std::vector<YAML::Node> documents;
  try {
    documents = LoadAllDocuments(yaml);
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(
        Cat(source_, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  if (documents.empty()) return std::nullopt;
  if (documents.size() > 1) {
    return Fail({documents[1], "", LineOf(documents[1], 1)},
                Cat(file, " holds one YAML document; a second one starts here"));
  }
  return YamlAt{documents[0], "", LineOf(documents[0], 1)};
}

absl::StatusOr<YamlFields> YamlReader::ReadMap(
    const YamlAt& v, std::string_view what, std::initializer_list<std::string_view> allowed,
    std::initializer_list<Unsupported> unsupported) const {
  Fields fields;
  fields.self_ = v;
  if (v.node.IsNull()) return fields;
  if (!v.node.IsMap()) return Fail(v, Cat("expected ", what, ", got ", DescribeNode(v.node)));
  for (auto it = v.node.begin(); it != v.node.end(); ++it) {
    const YAML::Node key = it->first;
    const int key_line = LineOf(key, v.line);
    if (!key.IsScalar()) {
      return Fail({key, v.path, key_line}, Cat("expected a key name, got ", DescribeNode(key)));
    }
    const std::string name = key.Scalar();
    const YamlAt at{key, JoinPath(v.path, name), key_line};
    for (const Fields::Entry& first : fields.entries_) {
      if (first.name == name) {
        return Fail(at, Cat("duplicate key (first at line ", first.key_line, ")"));
      }
    }
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      for (const Unsupported& u : unsupported) {
        if (u.key == name) return Fail(at, Cat("not supported by sluice: ", u.why));
      }
      return Fail(
          at, Cat("unknown key (expected one of: ", ListOf({allowed.begin(), allowed.end()}), ")"));
    }
    // An empty value (`key:`) takes its key's line: yaml-cpp marks an
    // implicit null where the next token starts, often a line further down.
    const YAML::Node value = it->second;
    const int line = value.IsNull() ? key_line : LineOf(value, key_line);
    fields.entries_.push_back({name, key_line, YamlAt{value, at.path, line}});
  }
  return fields;
}

absl::StatusOr<std::vector<YamlAt>> YamlReader::ReadList(const YamlAt& v,
                                                         std::string_view items) const {
  std::vector<YamlAt> out;
  if (v.node.IsNull()) return out;
  if (v.node.IsScalar()) {
    return Fail(v, Cat("expected a list of ", items, ", got ", DescribeNode(v.node), " (write [",
                       v.node.Scalar(), "])"));
  }
  if (!v.node.IsSequence()) {
    return Fail(v, Cat("expected a list of ", items, ", got ", DescribeNode(v.node)));
  }
  for (size_t i = 0; i < v.node.size(); ++i) {
    const YAML::Node item = v.node[i];
    out.push_back({item, Cat(v.path, "[", i, "]"), LineOf(item, v.line)});
  }
  return out;
}

absl::StatusOr<std::string> YamlReader::ReadScalar(const YamlAt& v,
                                                   std::string_view expected) const {
  if (!v.node.IsScalar()) {
    return Fail(v, Cat("expected ", expected, ", got ", DescribeNode(v.node)));
  }
  return v.node.Scalar();
}

absl::StatusOr<bool> YamlReader::ReadBool(const YamlAt& v) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "true or false");
  if (!text.ok()) return text.status();
  bool out = false;
  if (!YAML::convert<bool>::decode(v.node, out)) {
    return Fail(v, Cat("expected true or false, got \"", *text, "\""));
  }
  return out;
}

absl::StatusOr<int64_t> YamlReader::ReadInt(const YamlAt& v, int64_t min, int64_t max) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "an integer");
  if (!text.ok()) return text.status();
  const char* begin = text->data();
  const char* end = begin + text->size();
  int64_t value = 0;
  const auto [stop, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc::result_out_of_range && stop == end) {
    return Fail(v, Cat("\"", *text, "\" is too large"));
  }
  if (ec != std::errc() || stop != end) {
    return Fail(v, Cat("expected an integer, got \"", *text, "\""));
  }
  if (value < min || value > max) {
    if (max == std::numeric_limits<int64_t>::max()) {
      return Fail(v, Cat("must be at least ", min, ", got ", value));
    }
    return Fail(v, Cat("must be from ", min, " to ", max, ", got ", value));
  }
  return value;
}

absl::StatusOr<Duration> YamlReader::ReadDuration(const YamlAt& v, DurationBounds bounds) const {
  absl::StatusOr<Duration> d = ReadParsed(v, "a duration such as 250ms or 10s", ParseDuration);
  if (!d.ok()) return d.status();
  if (*d < bounds.min) {
    const std::string& text = v.node.Scalar();
    if (bounds.min == kPositive) return Fail(v, Cat("must be longer than 0, got ", text));
    return Fail(v, Cat("must be at least ", FormatDuration(bounds.min), ", got ", text));
  }
  if (*d > bounds.max) {
    return Fail(v,
                Cat("must be at most ", FormatDuration(bounds.max), ", got ", FormatDuration(*d)));
  }
  return *d;
}

absl::StatusOr<size_t> YamlReader::ReadChoiceIndex(
    const YamlAt& v, const std::vector<std::string_view>& names) const {
  const std::string expected = Cat("one of: ", ListOf(names));
  absl::StatusOr<std::string> text = ReadScalar(v, expected);
  if (!text.ok()) return text.status();
  const auto it = std::find(names.begin(), names.end(), *text);
  if (it == names.end()) return Fail(v, Cat("expected ", expected, "; got \"", *text, "\""));
  return static_cast<size_t>(it - names.begin());
}

absl::StatusOr<std::string> YamlReader::ReadName(const YamlAt& v, NameChars chars) const {
  absl::StatusOr<std::string> text = ReadScalar(v, "a name");
  if (!text.ok()) return text.status();
  if (text->empty()) return Fail(v, "must not be empty");
  switch (chars) {
    case NameChars::kToken:
      if (!std::all_of(text->begin(), text->end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
          })) {
        return Fail(v, Cat("name \"", *text, "\" may hold only letters, digits, '_', '.' and '-'"));
      }
      break;
    case NameChars::kLabel:
      if (!std::all_of(text->begin(), text->end(), [](char c) {
            return std::isprint(static_cast<unsigned char>(c)) && c != ',' && c != '"';
          })) {
        return Fail(v, Cat("name \"", *text, "\" may not hold ',', '\"' or control characters"));
      }
      break;
    case NameChars::kText:
      if (HasControlCharacter(*text)) return Fail(v, "must not hold control characters");
      break;
  }
  if (text->size() > kMaxNameLength) {
    // kText alone may hold UTF-8, whose characters are more than a byte.
    return Fail(v,
                Cat("name is ", text->size(), chars == NameChars::kText ? " bytes" : " characters",
                    " long, the most is ", kMaxNameLength));
  }
  return text;
}

absl::StatusOr<std::string> YamlReader::ReadText(const YamlAt& v, std::string_view what,
                                                 size_t max_bytes) const {
  absl::StatusOr<std::string> text = ReadScalar(v, what);
  if (!text.ok()) return text.status();
  if (text->empty()) return Fail(v, "must not be empty");
  if (text->size() > max_bytes) {
    return Fail(v, Cat("is ", text->size(), " bytes long, the most is ", max_bytes));
  }
  if (HasControlCharacter(*text)) return Fail(v, "must not hold control characters");
  return text;
}

absl::StatusOr<Rate> YamlReader::ReadRate(const YamlAt& v) const {
  return ReadParsed(v, "a rate such as 100/s or 10/5s", ParseRate);
}

absl::StatusOr<Algorithm> YamlReader::ReadAlgorithm(const YamlAt& v) const {
  static constexpr std::string_view kAlgorithms =
      "token_bucket, gcra, leaky_bucket, fixed_window, sliding_log, sliding_window, concurrency";
  absl::StatusOr<std::string> name = ReadScalar(v, Cat("one of: ", kAlgorithms));
  if (!name.ok()) return name.status();
  const std::optional<Algorithm> algorithm = AlgorithmFromName(*name);
  if (!algorithm) {
    return Fail(v, Cat("unknown algorithm \"", *name, "\" (expected one of: ", kAlgorithms, ")"));
  }
  return *algorithm;
}

absl::StatusOr<Rate> YamlReader::ReadLimitRate(const Fields& f) const {
  const YamlAt* rate = f.Find("rate");
  const YamlAt* limit = f.Find("limit");
  const YamlAt* period = f.Find("period");
  if (rate != nullptr && (limit != nullptr || period != nullptr)) {
    return Fail(limit != nullptr ? *limit : *period, "set rate or limit + period, not both");
  }
  if (rate != nullptr) return ReadRate(*rate);
  if (limit == nullptr && period == nullptr) {
    return Fail(f.Missing("rate"), "required (a rate such as 100/s, or limit + period)");
  }
  if (period == nullptr) return Fail(f.Missing("period"), "required with limit");
  if (limit == nullptr) return Fail(f.Missing("limit"), "required with period");
  Rate out;
  SLUICE_ASSIGN_OR_RETURN(out.limit, ReadInt(*limit, 1, kMaxLimit));
  SLUICE_ASSIGN_OR_RETURN(out.period, ReadDuration(*period, {.min = kPositive}));
  if (absl::Status s = ValidateRate(out); !s.ok()) return Fail(*period, s);
  return out;
}

absl::StatusOr<LimitOptions> YamlReader::ReadLimitOptions(const Fields& f) const {
  LimitOptions out;
  const YamlAt* algorithm = f.Find("algorithm");
  if (algorithm == nullptr) return Fail(f.Missing("algorithm"), "required");
  SLUICE_ASSIGN_OR_RETURN(out.algorithm, ReadAlgorithm(*algorithm));
  if (out.algorithm == Algorithm::kConcurrency) return ReadConcurrency(f, out);
  if (const YamlAt* x = f.Find("lease_ttl")) {
    return Fail(*x,
                Cat("lease_ttl applies only to concurrency, not ", AlgorithmName(out.algorithm)));
  }
  SLUICE_ASSIGN_OR_RETURN(out.rate, ReadLimitRate(f));
  if (const YamlAt* x = f.Find("burst")) {
    SLUICE_ASSIGN_OR_RETURN(out.burst, ReadInt(*x, 1, kMaxBurst));
  }
  if (const YamlAt* x = f.Find("mode")) {
    if (out.algorithm != Algorithm::kLeakyBucket) {
      return Fail(*x, Cat("mode applies only to leaky_bucket, not ", AlgorithmName(out.algorithm)));
    }
    SLUICE_ASSIGN_OR_RETURN(out.mode, ReadChoice<LeakyMode>(*x, {{"police", LeakyMode::kPolice},
                                                                 {"shape", LeakyMode::kShape}}));
  }
  if (const YamlAt* x = f.Find("max_delay")) {
    SLUICE_ASSIGN_OR_RETURN(out.max_delay, ReadDuration(*x));
  }
  if (const YamlAt* x = f.Find("queue")) {
    SLUICE_ASSIGN_OR_RETURN(out.queue, ReadInt(*x, 0, kMaxQueue));
  }
  return out;
}

// concurrency: limit (requests in flight) and lease_ttl; no rate, period
// or burst.
absl::StatusOr<LimitOptions> YamlReader::ReadConcurrency(const Fields& f, LimitOptions out) const {
  for (std::string_view other : {"rate", "period", "burst", "mode", "max_delay", "queue"}) {
    if (const YamlAt* x = f.Find(other)) {
      return Fail(*x, Cat(other,
                          " does not apply to concurrency (limit: the requests in flight; "
                          "lease_ttl: how long an unreleased slot is held)"));
    }
  }
  const YamlAt* limit = f.Find("limit");
  if (limit == nullptr) return Fail(f.Missing("limit"), "required (the requests in flight)");
  SLUICE_ASSIGN_OR_RETURN(out.rate.limit, ReadInt(*limit, 1, kMaxSlidingLogLimit));
  if (const YamlAt* x = f.Find("lease_ttl")) {
    SLUICE_ASSIGN_OR_RETURN(out.lease_ttl,
                            ReadDuration(*x, {.min = kMinLeaseTtl, .max = kMaxLeaseTtl}));
  }
  return out;
}

absl::StatusOr<Scope> YamlReader::ReadScope(const Fields& f, ScopeOptions options) const {
  const YamlAt* x = f.Find("scope");
  if (x == nullptr) return options.shared_store ? Scope::kGlobal : Scope::kLocal;
  SLUICE_ASSIGN_OR_RETURN(const Scope scope, ReadChoice<Scope>(*x, {{"local", Scope::kLocal},
                                                                    {"global", Scope::kGlobal}}));
  if (scope == Scope::kGlobal && !options.shared_store) {
    return Fail(*x, "global needs a shared store (store.redis), none is configured");
  }
  return scope;
}

}  // namespace sluice::internal
