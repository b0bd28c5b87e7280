// ucp-diff: compare two checkpoints of any layouts value by value through universal form; exit 0 when
// equal, 3 when they differ, 1 when they cannot be compared, 2 on a usage error (lib/inspect/diff.h).
#include <iostream>

#include "inspect/diff.h"
#include "parallel/mpi_session.h"
#include "tool/cli.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Compare two checkpoints (native of any layout, universal, or one of each) tensor by tensor through "
               "universal form. Exit 0: equal; 3: they differ; 1: cannot compare; 2: usage",
               "ucp-diff"};
  tool::CommonOptions common;
  std::string a, b;
  inspect::DiffOptions opt;
  opt.reporter = tool::console_reporter();
  app.add_option("a", a, "First checkpoint: universal folder, native checkpoint (global_stepN or its parent with "
                         "`latest`) or ucp-extract work folder")
      ->required();
  app.add_option("b", b, "Second checkpoint (any of the same kinds)")->required();
  app.add_option("--rtol", opt.rtol, "Relative tolerance: |a - b| <= atol + rtol * |b| counts as equal (default 0: "
                                     "bit for bit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--atol", opt.atol, "Absolute tolerance (default 0: bit for bit)")->check(CLI::NonNegativeNumber);
  app.add_option("--tmp-dir", opt.tmp_dir,
                 "Where a native input is converted to universal form (default: $TMPDIR, else /tmp); removed at exit");
  tool::add_threads_option(app, opt.threads);
  app.add_option("--max-listed", opt.listed, "Differences listed (the first ones)")->capture_default_str();
  tool::add_verify_option(app, opt.verify, "Check the inputs' checksums while reading");
  tool::add_pickle_options(app);
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  const int rc = tool::run("ucp-diff", [&] {
    const auto r = inspect::diff_checkpoints(a, b, opt);
    if (common.json) {
      tool::print_json(tool::envelope("ucp-diff", nullptr, r.to_json()));
    } else if (tool::verbosity() >= 0) {
      std::cout << r.text();
    }
    return r.equal() ? 0 : inspect::kDiffer;
  });
  parallel::die_if_interrupted();  // temporary folder removed: die as the signal asked
  return rc;
}
