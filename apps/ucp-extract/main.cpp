// ucp-extract: map phase of universal checkpointing (distributed checkpoint -> parameter fragments).
#include "parallel/mpi_session.h"
#include "tool/cli.h"
#include "tool/ucp_convert.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Extract parameter fragments from a DeepSpeed / Megatron-DeepSpeed checkpoint", "ucp-extract"};
  tool::CommonOptions common;
  tool::UcpConvertOptions o;
  app.add_option("--input", o.input, "Checkpoint folder (global_stepN/ or its parent with `latest`)")->required();
  app.add_option("--output", o.output, "Work folder for fragments (must not exist unless --overwrite)")->required();
  app.add_option("--patterns", o.convert.patterns_file, "Pattern file (patterns/*.json) when the checkpoint has none");
  tool::add_threads_option(app, o.convert.threads);
  tool::add_verify_option(app, o.verify, "Check the zip CRC-32 of the input files' records");
  app.add_flag("--no-sync", [&o](int64_t) { o.convert.sync = false; }, "Do not flush the output to stable storage before renaming it into place (scratch outputs)");
  app.add_flag("--allow-unused-patterns", o.convert.allow_unused_patterns, "Accept patterns that match no parameter");
  tool::add_overwrite_option(app, o.convert.overwrite, "Replace an existing work folder (atomically, at the end)");
  tool::add_dry_run_option(app, o.dry_run);
  if (int rc = tool::parse_checkpoint_tool(app, argc, argv, common); rc >= 0) return rc;
  const int rc = tool::run("ucp-extract", [&] {
    o.check();
    return tool::print_result("ucp-extract", tool::run_ucp_extract(o), common.json);
  });
  parallel::die_if_interrupted();  // staging folder removed: die as the signal asked
  return rc;
}
