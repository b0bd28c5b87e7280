// moe-replace: load-balanced, failure-tolerant expert placement.
#include "tool/cli.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Plan expert replica placement", "moe-replace"};
  tool::CommonOptions common;
  std::string loads, output;
  int nodes = 0, gpus = 0, slots = 0;
  app.add_option("--loads", loads, "Expert loads per MoE layer")->required();
  app.add_option("--nodes", nodes, "Nodes")->required();
  app.add_option("--gpus-per-node", gpus, "GPUs per node")->required();
  app.add_option("--slots-per-gpu", slots, "Replica slots per GPU")->required();
  app.add_option("--output", output, "Plan JSON to write")->required();
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  return tool::run("moe-replace", [&] {
    tool::not_implemented("moe-replace (issue 6)");
    return 0;
  });
}
