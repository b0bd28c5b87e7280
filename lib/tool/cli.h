// CLI11 glue shared by the tool drivers (included only by apps/*/main.cpp: CLI11 is a heavy header).
#pragma once
#include <CLI/CLI.hpp>

#include "io/pickle/class_paths.h"
#include "tool/tool.h"
#include "ucpkit/version.h"

namespace ucpkit::tool {

// Options every tool takes: --version, --json, -v/--verbose (repeatable), -q/--quiet.
struct CommonOptions {
  bool json = false;
  int verbose = 0;
  bool quiet = false;
  int verbosity() const { return quiet ? -1 : verbose; }
};

inline void add_common_options(CLI::App& app, CommonOptions& common) {
  app.set_version_flag("--version", version_text(app.get_name()));
  app.add_flag("--json", common.json, "Print a machine-readable JSON summary on stdout");
  app.add_flag("-v,--verbose", common.verbose, "More messages on stderr (repeatable)");
  app.add_flag("-q,--quiet", common.quiet, "Only errors on stderr");
}

// Options of the tools that read checkpoint pickles: --trust-module (repeatable).
inline void add_pickle_options(CLI::App& app) {
  app.add_option_function<std::vector<std::string>>(
         "--trust-module", [](const std::vector<std::string>& m) { pickle::trust_modules(m); },
         "Accept pickled classes of MODULE and its submodules (default: Python's standard library, torch, "
         "numpy, deepspeed, megatron and other training frameworks; '*': any module)")
      ->type_name("MODULE")
      ->take_all()
      ->allow_extra_args(false);
}

// Parses the command line; returns an exit code >= 0 when the tool must stop (help, version, usage
// error: code 2 with a one-line message), or -1 to go on.
inline int parse(CLI::App& app, int argc, char** argv, const CommonOptions& common) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": error: " << e.what() << " (see --help)\n";
    return kUsage;
  }
  set_verbosity(common.verbosity());
  return -1;
}

}  // namespace ucpkit::tool
