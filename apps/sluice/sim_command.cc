// `sluice sim`: runs a scenario (built in, or a YAML file) against every
// limiter it compares and prints the table, optionally with SVG plots.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "sim/builtin.h"
#include "sim/engine.h"
#include "sim/plot.h"
#include "sim/report.h"
#include "sim/scenario_file.h"

namespace sluice::cli {
namespace {

struct SimOptions {
  std::string scenario;
  bool list = false;
  bool print = false;
  std::optional<uint64_t> seed;
  std::string format = "text";
  std::string plot_dir;
};

int RunSim(const SimOptions& o) {
  if (o.list) {
    for (const sim::BuiltinScenario& b : sim::BuiltinScenarios()) {
      std::printf("%-16s %s\n", std::string(b.name).c_str(), std::string(b.summary).c_str());
    }
    return 0;
  }
  if (o.scenario.empty()) {
    std::cerr << "sluice sim: name a scenario (sluice sim --list) or a scenario file\n";
    return 2;
  }
  const sim::BuiltinScenario* builtin = nullptr;
  for (const sim::BuiltinScenario& b : sim::BuiltinScenarios()) {
    if (b.name == o.scenario) builtin = &b;
  }
  if (o.print) {
    if (builtin == nullptr) {
      std::cerr << "sluice sim: --print takes a built-in scenario (sluice sim --list)\n";
      return 2;
    }
    std::cout << builtin->yaml;
    return 0;
  }
  // A built-in name wins; anything else is a file.
  absl::StatusOr<sim::Scenario> scenario =
      builtin != nullptr ? sim::LoadBuiltin(o.scenario) : sim::LoadScenarioFile(o.scenario);
  if (!scenario.ok()) {
    if (builtin == nullptr && absl::IsNotFound(scenario.status())) {
      std::cerr << "sluice sim: \"" << o.scenario
                << "\" is neither a built-in scenario (sluice sim --list) nor a readable file\n";
    } else {
      std::cerr << "sluice sim: " << scenario.status().message() << "\n";
    }
    return 2;
  }
  for (const std::string& warning : scenario->warnings) {
    std::cerr << "sluice sim: warning: " << warning << "\n";
  }
  const uint64_t seed = o.seed.value_or(scenario->seed);
  absl::StatusOr<sim::Result> result = sim::Simulate(*scenario, seed);
  if (!result.ok()) {
    std::cerr << "sluice sim: " << result.status().message() << "\n";
    return 2;
  }
  if (o.format == "json") {
    std::cout << sim::FormatJson(*result);
  } else if (o.format == "csv") {
    std::cout << sim::FormatCsv(*result);
  } else {
    std::cout << sim::FormatText(*result);
  }
  if (!o.plot_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.plot_dir, ec);
    const std::string path =
        (std::filesystem::path(o.plot_dir) / (result->scenario + ".svg")).string();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << sim::PlotSvg(*result);
    out.close();
    if (!out) {
      std::cerr << "sluice sim: cannot write " << path << "\n";
      return 1;
    }
    std::cerr << "sluice sim: wrote " << path << "\n";
  }
  return 0;
}

}  // namespace

void AddSimCommand(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<SimOptions>();
  CLI::App* sim = app.add_subcommand(
      "sim",
      "Simulate traffic against every algorithm on a virtual clock, through the library's own "
      "decisions: a built-in scenario (--list) or a scenario file (docs/simulator.md)");
  sim->add_option("scenario", options->scenario,
                  "a built-in scenario's name, or a YAML scenario file");
  sim->add_flag("--list", options->list, "name the built-in scenarios");
  sim->add_flag("--print", options->print,
                "print a built-in scenario as a scenario file, to start one's own");
  sim->add_option("--seed", options->seed,
                  "seed of the random traffic and jitter (default: the scenario's)");
  sim->add_option("--format", options->format, "text, csv or json")
      ->check(CLI::IsMember({"text", "csv", "json"}))
      ->capture_default_str();
  sim->add_option("--plot", options->plot_dir,
                  "write DIR/<scenario>.svg: offered, admitted, rejected over time");
  sim->callback([options, &exit_code] { exit_code = RunSim(*options); });
}

}  // namespace sluice::cli
