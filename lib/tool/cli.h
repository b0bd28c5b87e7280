// CLI11 glue shared by the tool drivers (included only by apps/*/main.cpp: CLI11 is a heavy header).
#pragma once
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/pickle/class_paths.h"
#include "parallel/threads.h"
#include "tool/envelope.h"
#include "tool/size.h"
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

// The one vocabulary of the tools (docs/commands.md): --threads, --overwrite, --verify/--no-verify,
// --dry-run and size options take the same names and syntax in every tool that has the idea.

// A finite number in [lo, hi] (a whole number unless `whole` is false): the one range check of every
// numeric option (NaN, infinite, negative and absurdly large values were taken silently).
// CLI11 prefixes the option's name: "--vocab-multiple: 99999999 is out of range [1, 65536]" (exit 2).
inline CLI::Validator in_range(double lo, double hi, bool whole = true) {
  auto text = [](double v) {
    char b[32];
    if (v == std::floor(v) && std::fabs(v) < 1e18) std::snprintf(b, sizeof b, "%.0f", v);
    else std::snprintf(b, sizeof b, "%.15g", v);
    return std::string(b);
  };
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) return "'" + s + "' is not a finite number";
        if (whole && v != std::floor(v)) return "'" + s + "' is not a whole number";
        if (v < lo || v > hi) return s + " is out of range [" + text(lo) + ", " + text(hi) + "]";
        return "";
      },
      "[" + text(lo) + ", " + text(hi) + "]");
}
// Bounds shared by the tools (docs/commands.md, "Numbers"): parallel degrees and ranks, thread counts.
inline constexpr double kMaxDegree = 1 << 20;  // TP, PP, DP, EP, world size
inline constexpr double kMaxThreads = 4096;
inline constexpr uint64_t kMaxSize = uint64_t{1} << 50;  // 1P: every size option (--batch, --memory, --chunk, ...)

// --threads N (0: all cores).
inline CLI::Option* add_threads_option(CLI::App& app, int& threads) {
  return app.add_option("--threads", threads, "Threads inside this process (0 = all cores)")
      ->check(in_range(0, kMaxThreads))
      ->capture_default_str();
}

// Runs a tool body on at most `threads` TBB threads (0: all cores): --threads of the tools whose
// library takes no thread count of its own.
inline int in_threads(int threads, const std::function<int()>& body) {
  int rc = 0;
  parallel::in_arena(threads, [&] { rc = body(); });
  return rc;
}

// --overwrite (and old names of it, e.g. "--force"): replace an existing output.
inline CLI::Option* add_overwrite_option(CLI::App& app, bool& overwrite, const std::string& help,
                                         const std::string& aliases = "") {
  return app.add_flag("--overwrite" + (aliases.empty() ? "" : "," + aliases), overwrite, help);
}

// --verify / --no-verify, one flag with both polarities; `verify` holds the tool's default.
inline CLI::Option* add_verify_option(CLI::App& app, bool& verify, const std::string& what) {
  return app.add_flag("--verify,!--no-verify", verify,
                      what + (verify ? " (default: on; --no-verify skips it)" : " (default: off; --verify asks for it)"));
}

// --dry-run: the human summary of what would be written; nothing is written.
inline CLI::Option* add_dry_run_option(CLI::App& app, bool& dry_run) {
  return app.add_flag("--dry-run", dry_run,
                      "Print a short summary of what would be written and write nothing (with --json: the summary "
                      "as JSON)");
}

// An old size option in its own unit: `--memory-mb 256` is 256 x 2^20 bytes.
struct SizeAlias {
  std::string name;
  double unit;  // bytes per unit of the old option
};

// A size option in bytes (tool/size.h: 256M, 5G, 64K, plain bytes) named `names` ("--memory" or
// "--budget,--budget-bytes": every name takes the size syntax), and `aliases`, old options taking a
// plain number in their own unit (hidden from --help, named in its text). `bytes` holds the default.
inline CLI::Option* add_size_option(CLI::App& app, const std::string& names, uint64_t& bytes, std::string help,
                                    const std::vector<SizeAlias>& aliases = {}) {
  const std::string first = names.substr(0, names.find(','));
  for (const auto& a : aliases) help += "; old form " + a.name + " N";
  if (bytes) help += " (default " + size_text(bytes) + ")";
  // The new and the old form set the same bytes: both given is one option given twice.
  auto given = std::make_shared<std::string>();
  auto once = [given](const std::string& name) {
    if (!given->empty() && *given != name) throw CLI::ValidationError(*given + " and " + name + " are the same option: give one");
    *given = name;
  };
  auto* opt = app.add_option_function<std::string>(
                     names,
                     [&bytes, first, once](const std::string& text) {
                       once(first);
                       try {
                         bytes = parse_size(text, first);
                       } catch (const UsageError& e) {
                         throw CLI::ValidationError(e.what());
                       }
                       if (bytes > kMaxSize) throw CLI::ValidationError(first + " " + text + ": larger than 1P, the most a size option takes");
                     },
                     help)
                  ->type_name("SIZE");
  for (const auto& a : aliases)
    app.add_option_function<double>(
           a.name,
           [&bytes, a, once](double n) {
             once(a.name);
             if (!(n >= 0) || !std::isfinite(n)) throw CLI::ValidationError(a.name + " " + std::to_string(n) + ": not a size");
             if (n * a.unit > static_cast<double>(kMaxSize))
               throw CLI::ValidationError(a.name + " gives " + std::to_string(n * a.unit) + " bytes: larger than 1P, the most a size option takes");
             bytes = static_cast<uint64_t>(std::llround(n * a.unit));
           },
           "")
        ->group("");
  return opt;
}

// The command line's arguments (the tools' option checks name an option as typed: tool/typed_name.h).
inline std::vector<std::string> arguments(int argc, char** argv) { return {argv + 1, argv + argc}; }

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
    // The message quotes what was typed: control bytes (an escape sequence, a newline) are shown as
    // \xNN and the line is cut, so it stays one line that cannot drive the terminal.
    const std::string what = escaped_brief(e.what(), 300) + " (see --help)";
    std::cerr << app.get_name() << ": error: " << what << "\n";
    for (int i = 1; i < argc; ++i)  // --json asked for, even if the parse stopped before it
      if (std::string_view(argv[i]) == "--json") set_json(true);
    print_error_envelope(app.get_name().c_str(), what, kUsage);
    return kUsage;
  }
  set_json(common.json);
  set_verbosity(common.verbosity());
  return -1;
}

// The options every checkpoint tool takes besides its own (--trust-module, then --version, --json,
// -v, -q: added last, --help lists them last), and the parse (parse() above: >= 0 means stop).
inline int parse_checkpoint_tool(CLI::App& app, int argc, char** argv, CommonOptions& common) {
  add_pickle_options(app);
  add_common_options(app, common);
  return parse(app, argc, argv, common);
}

}  // namespace ucpkit::tool
