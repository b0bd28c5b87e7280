// pec-restore: rebuild a full checkpoint from a chain of partial expert checkpoints.
#include "tool/cli.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Restore a complete checkpoint from a PEC store", "pec-restore"};
  tool::CommonOptions common;
  std::string store, fast_store, output, tokens, report;
  long long step = -1;
  double plt_threshold = 0.0375;
  app.add_option("--store", store, "PEC store folder")->required();
  app.add_option("--fast-store", fast_store, "Fast tier folder");
  app.add_option("--output", output, "Checkpoint folder to write")->required();
  app.add_option("--step", step, "Step to restore (default: latest committed)");
  app.add_option("--tokens", tokens, "Tokens per expert (JSON, CSV or router JSONL)");
  app.add_option("--report", report, "Write the restore report (JSON) here");
  app.add_option("--plt-threshold", plt_threshold, "PLT threshold above which K doubles")->capture_default_str();
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  return tool::run("pec-restore", [&] {
    tool::not_implemented("pec-restore (issue 5)");
    return 0;
  });
}
