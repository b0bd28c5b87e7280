// ucp-extract: map phase of universal checkpointing (distributed checkpoint -> parameter fragments).
#include <iostream>

#include "io/torch/verify.h"
#include "tool/cli.h"
#include "tool/dry_run.h"
#include "to_universal/convert.h"
#include "parallel/mpi_session.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Extract parameter fragments from a DeepSpeed / Megatron-DeepSpeed checkpoint", "ucp-extract"};
  tool::CommonOptions common;
  std::string input, output;
  to_universal::ConvertOptions opt;
  opt.reporter = tool::console_reporter();
  bool verify = true, dry_run = false;
  app.add_option("--input", input, "Checkpoint folder (global_stepN/ or its parent with `latest`)")->required();
  app.add_option("--output", output, "Work folder for fragments (must not exist unless --overwrite)")->required();
  app.add_option("--patterns", opt.patterns_file, "Pattern file (patterns/*.json) when the checkpoint has none");
  tool::add_threads_option(app, opt.threads);
  tool::add_verify_option(app, verify, "Check the zip CRC-32 of the input files' records");
  app.add_flag("--no-sync", [&opt](int64_t) { opt.sync = false; }, "Do not flush the output to stable storage before renaming it into place (scratch outputs)");
  app.add_flag("--allow-unused-patterns", opt.allow_unused_patterns, "Accept patterns that match no parameter");
  tool::add_overwrite_option(app, opt.overwrite, "Replace an existing work folder (atomically, at the end)");
  tool::add_dry_run_option(app, dry_run);
  tool::add_pickle_options(app);
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  const int rc = tool::run("ucp-extract", [&] {
    set_verify_files_crc(verify);
    const bool root = parallel::MpiSession::get().rank() == 0;
    if (dry_run) {
      const auto d = tool::extract_dry_run(input, output, opt);
      if (root) tool::print_dry_run("ucp-extract", d, common.json);
      return 0;
    }
    auto s = to_universal::run_extract(input, output, opt);
    if (root) {
      if (common.json) tool::print_json(tool::envelope("ucp-extract", s.output, s.to_json()));
      tool::info(std::to_string(s.params) + " parameters, " + std::to_string(s.files_written) + " files -> " + output);
    }
    return 0;
  });
  parallel::die_if_interrupted();  // staging folder removed: die as the signal asked
  return rc;
}
