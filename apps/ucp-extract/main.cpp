// ucp-extract: map phase of universal checkpointing (distributed checkpoint -> parameter fragments).
#include <iostream>

#include "io/torch/verify.h"
#include "tool/cli.h"
#include "ucp/convert.h"
#include "parallel/mpi_session.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Extract parameter fragments from a DeepSpeed / Megatron-DeepSpeed checkpoint", "ucp-extract"};
  tool::CommonOptions common;
  std::string input, output;
  ucp::ConvertOptions opt;
  opt.reporter = tool::console_reporter();
  app.add_option("--input", input, "Checkpoint folder (global_stepN/ or its parent with `latest`)")->required();
  app.add_option("--output", output, "Work folder for fragments (must not exist unless --overwrite)")->required();
  app.add_option("--patterns", opt.patterns_file, "Pattern file (patterns/*.json) when the checkpoint has none");
  app.add_option("--threads", opt.threads, "TBB threads (0 = all cores)")->check(CLI::NonNegativeNumber);
  app.add_flag("--no-verify", [](int64_t) { set_verify_files_crc(false); },
               "Do not check the zip CRC-32 of the input files' records (they are checked by default)");
  app.add_flag("--no-sync", [&opt](int64_t) { opt.sync = false; }, "Do not flush the output to stable storage before renaming it into place (scratch outputs)");
  app.add_flag("--allow-unused-patterns", opt.allow_unused_patterns, "Accept patterns that match no parameter");
  app.add_flag("--overwrite", opt.overwrite, "Replace an existing work folder (atomically, at the end)");
  tool::add_pickle_options(app);
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  const int rc = tool::run("ucp-extract", [&] {
    auto s = ucp::run_extract(input, output, opt);
    if (parallel::MpiSession::get().rank() == 0) {
      if (common.json) std::cout << s.to_json().dump(1) << "\n";
      tool::info(std::to_string(s.params) + " parameters, " + std::to_string(s.files_written) +
                 " fragment files -> " + output);
    }
    return 0;
  });
  parallel::die_if_interrupted();  // staging folder removed: die as the signal asked
  return rc;
}
