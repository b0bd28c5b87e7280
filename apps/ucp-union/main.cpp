// ucp-union: reduce phase of universal checkpointing (fragments -> atomic universal checkpoint).
#include "tool/cli.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Join parameter fragments into a universal checkpoint", "ucp-union"};
  tool::CommonOptions common;
  std::string input, output, patterns;
  int threads = 0;
  app.add_option("--input", input, "Work folder from ucp-extract, or a checkpoint folder (one-step mode)")
      ->required();
  app.add_option("--output", output, "Universal checkpoint folder to create")->required();
  app.add_option("--patterns", patterns, "Pattern file (patterns/*.json) when the checkpoint has none");
  app.add_option("--threads", threads, "TBB threads (0 = all cores)");
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  return tool::run("ucp-union", [&] {
    tool::not_implemented("ucp-union (issue 3)");
    return 0;
  });
}
