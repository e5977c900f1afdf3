// sluice: the one binary. `serve` runs the HTTP gateway, the decision service
// and the admin endpoints; `explain` shows one limit's decisions; `sim`
// simulates traffic against every algorithm and `replay` runs an access log
// through a config's policies (both in commands.h, files of their own).
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/synchronization/mutex.h"

#include "commands.h"
#include "server/server.h"
#include "server/setup.h"
#include "sluice/algorithm.h"
#include "sluice/build_info.h"
#include "sluice/config.h"
#include "sluice/rate.h"
#include "sluice/version.h"
#include "spdlog/async.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"
#include "systemd_notify.h"

namespace {

// `sluice explain`: shows what a limit does with a burst of requests,
// decided by the same code the library runs.
int Explain(const std::string& algorithm_name, const std::string& rate_text, int64_t burst,
            const std::string& mode, const std::string& max_delay_text, int64_t queue,
            int64_t requests, const std::string& spacing_text) {
  const std::optional<sluice::Algorithm> algorithm = sluice::AlgorithmFromName(algorithm_name);
  if (!algorithm) {
    std::cerr << "sluice: unknown algorithm \"" << algorithm_name
              << "\" (token_bucket, gcra, leaky_bucket, fixed_window, sliding_log, "
                 "sliding_window)\n";
    return 2;
  }
  const absl::StatusOr<sluice::Rate> rate = sluice::ParseRate(rate_text);
  if (!rate.ok()) {
    std::cerr << "sluice: " << rate.status().message() << "\n";
    return 2;
  }
  sluice::LimitOptions options{
      .algorithm = *algorithm, .rate = *rate, .burst = burst, .queue = queue};
  if (mode == "shape") {
    options.mode = sluice::LeakyMode::kShape;
  } else if (mode != "police") {
    std::cerr << "sluice: --mode must be police or shape, got \"" << mode << "\"\n";
    return 2;
  }
  if (!max_delay_text.empty()) {
    const absl::StatusOr<sluice::Duration> d = sluice::ParseDuration(max_delay_text);
    if (!d.ok()) {
      std::cerr << "sluice: --max-delay: " << d.status().message() << "\n";
      return 2;
    }
    options.max_delay = *d;
  }
  const absl::StatusOr<sluice::Duration> spacing = sluice::ParseDuration(spacing_text);
  if (!spacing.ok()) {
    std::cerr << "sluice: --every: " << spacing.status().message() << "\n";
    return 2;
  }
  const absl::StatusOr<sluice::LimitConfig> config = sluice::MakeLimit(options);
  if (!config.ok()) {
    std::cerr << "sluice: " << config.status().message() << "\n";
    return 2;
  }
  std::printf("%-10s %-7s %9s %12s %12s %12s\n", "t", "allowed", "remaining", "retry_after",
              "reset_after", "delay");
  auto print = [](sluice::Time t, const sluice::Decision& d) {
    std::printf(
        "%-10s %-7s %9lld %12s %12s %12s\n",
        sluice::FormatDuration(t - sluice::Time::UnixEpoch()).c_str(), d.allowed ? "yes" : "no",
        static_cast<long long>(d.remaining), sluice::FormatDuration(d.retry_after).c_str(),
        sluice::FormatDuration(d.reset_after).c_str(), sluice::FormatDuration(d.delay).c_str());
  };
  std::visit(
      [&](const auto& c) {
        sluice::StateOf_t<std::decay_t<decltype(c)>> state{};
        for (int64_t i = 0; i < requests; ++i) {
          const sluice::Time t = sluice::Time::UnixEpoch() + *spacing * i;
          print(t, sluice::DecideInPlace(c, state, t, 1));
        }
      },
      *config);
  return 0;
}

// `sluice serve`: the gateway, the decision API and the admin endpoints.
// `--check` and `--check-config` stop after reading the config and making
// its TLS contexts.
int Serve(const std::string& config_path, bool check_only) {
  // The config is read here, once; the source re-reads it on SIGHUP and
  // when the file changes.
  absl::StatusOr<std::unique_ptr<sluice::server::ConfigSource>> source =
      sluice::server::ConfigSource::Open(config_path);
  if (!source.ok()) {
    std::cerr << "sluice: " << source.status().message() << "\n";
    return 2;
  }
  const sluice::Config* config = &(*source)->initial();
  if (check_only) {
    // The TLS files made into contexts, as a start makes them: a key that
    // is not its certificate's fails here, not at the start.
    if (absl::Status tls = sluice::server::CheckTlsFiles(*config); !tls.ok()) {
      std::cerr << "sluice: " << tls.message() << "\n";
      return 2;
    }
    for (const std::string& line : sluice::ConfigWarnings(*config)) {
      std::cerr << "sluice: warning: " << line << "\n";
    }
    std::cout << config_path << ": ok (" << config->policies.size() << " policies, "
              << config->routes.size() << " routes)\n";
    return 0;
  }
  // Debian builds Abseil with its debug checks, so every absl::Mutex lock
  // (gRPC's, on the Envoy RLS path) also kept a deadlock graph behind one
  // process-wide lock: about 4% of the gRPC server's CPU
  // (bench/README.md, "gRPC"). A debugging aid, off in serving.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Logs go to stderr, one line per event; stdout stays free for output.
  // Written by a logging thread: an event loop only queues the line, so a
  // slow stderr (a full pipe) never blocks a loop; when the queue is full the
  // oldest lines are dropped rather than stalling requests.
  spdlog::init_thread_pool(16384, 1);
  spdlog::set_default_logger(spdlog::create_async_nb<spdlog::sinks::stderr_sink_mt>("sluice"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e%z level=%l %v");
  absl::StatusOr<std::unique_ptr<sluice::server::Server>> server =
      sluice::server::Server::Create(**source, {.lifecycle = sluice::cli::NotifySystemd});
  if (!server.ok()) {
    spdlog::shutdown();
    std::cerr << "sluice: " << server.status().message() << "\n";
    return 2;
  }
  absl::Status status = (*server)->Run();
  spdlog::shutdown();  // flush the queue before exiting
  if (!status.ok()) {
    std::cerr << "sluice: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "sluice " SLUICE_VERSION
      ": a rate limiter for services.\n"
      "  sluice serve --config FILE        the HTTP gateway, decision API and admin endpoints\n"
      "  sluice serve --check-config FILE  validate a config: exit 0, or 2 (file:line)\n"
      "  sluice explain ...                how one limit answers a run of requests\n"
      "  sluice sim NAME|FILE              simulate traffic against every algorithm (--list)\n"
      "  sluice replay LOG --config F      run an access log through a config's policies\n"
      "Run `sluice COMMAND --help` for a command's options."};
  // The version, the commit built (short hash, "+dirty" when the tree
  // differed from it, "unknown" outside git) and the build type.
  app.set_version_flag("--version",
                       "sluice " SLUICE_VERSION " (revision " SLUICE_REVISION
                       ", build " SLUICE_BUILD_TYPE ")",
                       "print the version, the git revision and the build type, and exit");
  app.require_subcommand(0, 1);

  std::string algorithm = "token_bucket", rate = "10/s", mode = "police", max_delay, every = "0s";
  int64_t burst = 0, queue = 0, requests = 20;
  CLI::App* explain = app.add_subcommand(
      "explain", "Decide a run of requests against one limit and print each decision");
  explain
      ->add_option("--algorithm,-a", algorithm,
                   "token_bucket, gcra, leaky_bucket, fixed_window, sliding_log, "
                   "sliding_window")
      ->capture_default_str();
  explain->add_option("--rate,-r", rate, "LIMIT/PERIOD, e.g. 100/s, 40/min, 10/5s")
      ->capture_default_str();
  explain->add_option("--burst,-b", burst, "bucket capacity (default: the rate's limit)");
  explain->add_option("--mode", mode, "leaky_bucket: police or shape")->capture_default_str();
  explain->add_option("--max-delay", max_delay, "leaky_bucket shape: longest hold, e.g. 5s");
  explain->add_option("--queue", queue, "leaky_bucket shape: most requests waiting");
  explain->add_option("--requests,-n", requests, "how many requests")->capture_default_str();
  explain->add_option("--every", every, "time between requests, e.g. 0s, 50ms")
      ->capture_default_str();

  std::string config_path, check_config_path;
  bool check_only = false;
  CLI::App* serve = app.add_subcommand(
      "serve",
      "Run the gateway, the decision API (POST /v1/check, /v1/auth) and the admin "
      "listener (/metrics, /healthz, /readyz, /v1/config, /v1/keys) from a YAML config; "
      "SIGHUP or a change of the file reloads it, SIGTERM drains and exits. Under "
      "systemd (Type=notify) it reports ready, reloading and stopping (docs/deploy.md)");
  // Exactly one of the two: the config to serve, or the config to check.
  CLI::Option_group* source = serve->add_option_group("config", "the config to serve, or to check");
  source->add_option("--config,-c", config_path, "the YAML config (docs/configuration.md)")
      ->type_name("FILE");
  source
      ->add_option("--check-config", check_config_path,
                   "validate this config and exit: 0 when valid, 2 with file:line and "
                   "the problem on stderr when not (for ExecStartPre and CI)")
      ->type_name("FILE");
  source->require_option(1);
  serve->add_flag("--check", check_only, "with --config: validate it and exit, as --check-config");

  int command_exit = -1;  // set by the commands that run from a CLI11 callback
  sluice::cli::AddSimCommand(app, command_exit);
  sluice::cli::AddReplayCommand(app, command_exit);

  CLI11_PARSE(app, argc, argv);
  if (command_exit >= 0) return command_exit;
  if (serve->parsed()) {
    if (!check_config_path.empty()) return Serve(check_config_path, /*check_only=*/true);
    return Serve(config_path, check_only);
  }
  if (explain->parsed()) {
    return Explain(algorithm, rate, burst, mode, max_delay, queue, requests, every);
  }
  std::cout << app.help();
  return 0;
}
