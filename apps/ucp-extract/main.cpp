// ucp-extract: map phase of universal checkpointing (distributed checkpoint -> parameter fragments).
#include "tool/cli.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Extract parameter fragments from a DeepSpeed / Megatron-DeepSpeed checkpoint", "ucp-extract"};
  tool::CommonOptions common;
  std::string input, output, patterns;
  int threads = 0;
  app.add_option("--input", input, "Checkpoint folder (global_stepN/ or its parent with `latest`)")->required();
  app.add_option("--output", output, "Work folder for fragments")->required();
  app.add_option("--patterns", patterns, "Pattern file (patterns/*.json) when the checkpoint has none");
  app.add_option("--threads", threads, "TBB threads (0 = all cores)");
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  return tool::run("ucp-extract", [&] {
    tool::not_implemented("ucp-extract (issue 3)");
    return 0;
  });
}
