// ucp-union: reduce phase of universal checkpointing (fragments -> atomic universal checkpoint).
#include <iostream>

#include "io/torch/verify.h"
#include "tool/cli.h"
#include "tool/dry_run.h"
#include "to_universal/convert.h"
#include "parallel/mpi_session.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Join parameter fragments into a universal checkpoint", "ucp-union"};
  tool::CommonOptions common;
  std::string input, output;
  to_universal::ConvertOptions opt;
  opt.reporter = tool::console_reporter();
  bool verify = true, dry_run = false;
  app.add_option("--input", input, "Work folder from ucp-extract, or a checkpoint folder (one-step mode)")
      ->required();
  app.add_option("--output", output, "Universal checkpoint folder to create")->required();
  app.add_option("--patterns", opt.patterns_file, "Pattern file (patterns/*.json) when the checkpoint has none");
  tool::add_threads_option(app, opt.threads);
  tool::add_verify_option(app, verify, "Check the zip CRC-32 of the input files' records");
  app.add_flag("--no-sync", [&opt](int64_t) { opt.sync = false; }, "Do not flush the output to stable storage before renaming it into place (scratch outputs)");
  app.add_option("--tolerance", opt.tolerance, "Accept TP-replicated copies differing by at most this")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--allow-unused-patterns", opt.allow_unused_patterns, "Accept patterns that match no parameter");
  tool::add_overwrite_option(app, opt.overwrite, "Replace an existing output folder (atomically, at the end)");
  tool::add_dry_run_option(app, dry_run);
  tool::add_pickle_options(app);
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  const int rc = tool::run("ucp-union", [&] {
    set_verify_files_crc(verify);
    const bool root = parallel::MpiSession::get().rank() == 0;
    if (dry_run) {
      const auto d = tool::union_dry_run(input, output, opt);
      if (root) tool::print_dry_run("ucp-union", d, common.json);
      return 0;
    }
    auto s = to_universal::run_union(input, output, opt);
    if (root) {
      if (common.json) tool::print_json(tool::envelope("ucp-union", s.output, s.to_json()));
      tool::info(std::to_string(s.params) + " parameters -> " + output);
    }
    return 0;
  });
  parallel::die_if_interrupted();  // staging folder removed: die as the signal asked
  return rc;
}
