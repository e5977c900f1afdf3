// `sluice replay`: an access log through the policies of a config, and a
// report of who would have been limited and what limits would fit.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "replay/log_reader.h"
#include "replay/replay.h"
#include "sluice/config.h"

namespace sluice::cli {
namespace {

struct ReplayCommandOptions {
  std::string log;
  std::string config;
  std::string format = "text";
  std::string log_format = "auto";
  std::vector<std::string> fields;
  std::vector<std::string> policies;
  size_t top = 10;
  int64_t max_keys = 1'000'000;
  bool quiet = false;
};

// Progress on stderr: a bar redrawn in place on a terminal, otherwise a
// plain line every 2^20 lines (a log file or CI output stays readable).
class Progress {
 public:
  explicit Progress(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) == 1) {}

  void Update(const replay::LineReader& in, int64_t lines) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    if (tty_) {
      if (now - last_ < std::chrono::milliseconds(100)) return;
      last_ = now;
      const double seconds = std::chrono::duration<double>(now - start_).count();
      const double per_second = seconds > 0 ? static_cast<double>(lines) / seconds : 0;
      if (in.size() > 0) {
        const double done =
            std::min(1.0, static_cast<double>(in.position()) / static_cast<double>(in.size()));
        const int filled = static_cast<int>(done * 30);
        std::fprintf(stderr, "\r[%s%s] %3d%%  %lld lines  %.0fk lines/s ",
                     std::string(filled, '#').c_str(), std::string(30 - filled, '.').c_str(),
                     static_cast<int>(done * 100), static_cast<long long>(lines),
                     per_second / 1000);
      } else {
        std::fprintf(stderr, "\r%lld lines  %.0fk lines/s ", static_cast<long long>(lines),
                     per_second / 1000);
      }
      drawn_ = true;
    } else if ((lines & ((1 << 20) - 1)) == 0 && lines > 0) {
      if (in.size() > 0) {
        std::fprintf(stderr, "sluice replay: %lld lines (%d%%)\n", static_cast<long long>(lines),
                     static_cast<int>(100.0 * static_cast<double>(in.position()) /
                                      static_cast<double>(in.size())));
      } else {
        std::fprintf(stderr, "sluice replay: %lld lines\n", static_cast<long long>(lines));
      }
    }
  }
  void Done() {
    if (drawn_) std::fputs("\r\033[K", stderr);  // clear the bar
  }

 private:
  bool quiet_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

int RunReplay(const ReplayCommandOptions& o) {
  absl::StatusOr<Config> config = LoadConfigFile(o.config);
  if (!config.ok()) {
    std::cerr << "sluice replay: " << config.status().message() << "\n";
    return 2;
  }
  replay::ReplayOptions options{.top = o.top, .max_keys = o.max_keys};
  absl::StatusOr<replay::LogFormat> format = replay::ParseLogFormat(o.log_format);
  if (!format.ok()) {
    std::cerr << "sluice replay: --log-format: " << format.status().message() << "\n";
    return 2;
  }
  options.format = *format;
  for (const std::string& f : o.fields) {
    if (absl::Status s = replay::ApplyFieldMapping(f, options.fields); !s.ok()) {
      std::cerr << "sluice replay: --field: " << s.message() << "\n";
      return 2;
    }
  }
  options.apply = o.policies;
  absl::StatusOr<std::unique_ptr<replay::LineReader>> in = replay::LineReader::Open(o.log);
  if (!in.ok()) {
    std::cerr << "sluice replay: " << in.status().message() << "\n";
    return 2;
  }
  Progress progress(o.quiet);
  options.progress = [&progress](const replay::LineReader& r, int64_t lines) {
    progress.Update(r, lines);
  };
  absl::StatusOr<replay::ReplayReport> report = replay::Replay(*config, **in, options);
  progress.Done();
  if (!report.ok()) {
    std::cerr << "sluice replay: " << report.status().message() << "\n";
    return 2;
  }
  report->log = o.log;
  std::cout << (o.format == "json" ? replay::FormatReplayJson(*report)
                                   : replay::FormatReplayText(*report));
  if (!report->input_error.empty()) {
    std::cerr << "sluice replay: input ended early: " << report->input_error << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

void AddReplayCommand(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ReplayCommandOptions>();
  CLI::App* replay = app.add_subcommand(
      "replay",
      "Run an access log (NGINX/Apache combined or JSON lines, plain or gzip) through the "
      "policies of a config at its logged times: who would have been limited, when, and "
      "limits that fit the observed traffic");
  replay->add_option("log", o->log, "the access log; - reads standard input")->required();
  replay->add_option("--config,-c", o->config, "the YAML config sluice serve reads")->required();
  replay->add_option("--format", o->format, "report as text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  replay->add_option("--log-format", o->log_format, "auto, combined or json")
      ->capture_default_str();
  replay->add_option("--field", o->fields,
                     "JSON lines: NAME=FIELD, NAME one of time, ip, method, path, request, host, "
                     "header:HEADER-NAME (repeatable)");
  replay->add_option(
      "--policy", o->policies,
      "apply this policy to every line, whatever its match (repeatable; decision-API "
      "policies have no match)");
  replay->add_option("--top", o->top, "offenders listed per policy")->capture_default_str();
  replay->add_option("--max-keys", o->max_keys, "keys tracked per policy for the report")
      ->capture_default_str();
  replay->add_flag("--quiet,-q", o->quiet, "no progress on stderr");
  replay->callback([o, &exit_code] { exit_code = RunReplay(*o); });
}

}  // namespace sluice::cli
