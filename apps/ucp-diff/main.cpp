// ucp-diff: compare two checkpoints of any layouts value by value through universal form; exit 0 when
// equal, 3 when they differ, 1 when they cannot be compared, 2 on a usage error (lib/inspect/diff.h).
#include "parallel/mpi_session.h"
#include "tool/cli.h"
#include "tool/ucp_inspect.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Compare two checkpoints (native of any layout, universal, or one of each) tensor by tensor through "
               "universal form. Exit 0: equal; 3: they differ; 1: cannot compare; 2: usage",
               "ucp-diff"};
  tool::CommonOptions common;
  tool::UcpDiffOptions o;
  app.add_option("a", o.a, "First checkpoint: universal folder (from any source), native checkpoint (global_stepN or "
                           "its parent with `latest`), ucp-extract work folder, PyTorch DCP or Megatron-Core "
                           "torch_dist folder, or Hugging Face model folder")
      ->required();
  app.add_option("b", o.b, "Second checkpoint (any of the same kinds)")->required();
  app.add_option("--rtol", o.diff.rtol, "Relative tolerance: |a - b| <= atol + rtol * |b| counts as equal (default 0: "
                                        "bit for bit)")
      ->check(tool::in_range(0, 1e30, false));
  app.add_option("--atol", o.diff.atol, "Absolute tolerance (default 0: bit for bit)")->check(tool::in_range(0, 1e30, false));
  app.add_option("--tmp-dir", o.diff.tmp_dir,
                 "Where a native input is converted to universal form (default: $TMPDIR, else /tmp); removed at exit");
  tool::add_threads_option(app, o.diff.threads);
  app.add_option("--max-listed", o.diff.listed, "Differences listed (the first ones)")
      ->check(tool::in_range(0, 1e9))
      ->capture_default_str();
  tool::add_verify_option(app, o.diff.verify, "Check the inputs' checksums while reading");
  if (int rc = tool::parse_checkpoint_tool(app, argc, argv, common); rc >= 0) return rc;
  const int rc = tool::run("ucp-diff", [&] {
    o.check();
    return tool::print_result("ucp-diff", tool::run_ucp_diff(o), common.json);
  });
  parallel::die_if_interrupted();  // temporary folder removed: die as the signal asked
  return rc;
}
