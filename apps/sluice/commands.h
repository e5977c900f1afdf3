// Subcommands of the `sluice` binary that live in files of their own.
//
// Each Add* function registers its subcommands on the CLI11 app; the
// subcommand runs from its CLI11 callback while the command line is parsed
// and stores its exit code in `exit_code` (left untouched when it did not
// run), so main() stays a list of commands:
//
//   int exit_code = -1;
//   sluice::cli::AddSimCommand(app, exit_code);
//   CLI11_PARSE(app, argc, argv);
//   if (exit_code >= 0) return exit_code;
#ifndef SLUICE_APPS_SLUICE_COMMANDS_H_
#define SLUICE_APPS_SLUICE_COMMANDS_H_

#include <CLI/CLI.hpp>

namespace sluice::cli {

// `sluice sim [NAME|FILE] [--list] [--print] [--seed N] [--format text|csv|json] [--plot DIR]`
void AddSimCommand(CLI::App& app, int& exit_code);

// `sluice replay ACCESS_LOG --config FILE [--format text|json] [--log-format ...] ...`
void AddReplayCommand(CLI::App& app, int& exit_code);

}  // namespace sluice::cli

#endif  // SLUICE_APPS_SLUICE_COMMANDS_H_
