// pec-save: partial expert checkpointing into a crash-safe store.
#include "tool/cli.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Save non-expert state and a selection of experts into a PEC store", "pec-save"};
  tool::CommonOptions common;
  std::string checkpoint, store, policy, tokens, fast_store;
  long long step = 0, budget = 0;
  int k = 0, k_snapshot = 0, k_persist = 0;
  app.add_option("--checkpoint", checkpoint, "Full checkpoint folder written by the training job")->required();
  app.add_option("--store", store, "PEC store folder")->required();
  app.add_option("--step", step, "Training step being saved")->required();
  app.add_option("--policy", policy, "Expert selection policy")
      ->required()
      ->check(CLI::IsMember({"sequential", "load-aware", "budget"}));
  app.add_option("--k", k, "Experts saved per MoE layer");
  app.add_option("--budget-bytes", budget, "Byte budget for experts (budget policy)");
  app.add_option("--tokens", tokens, "Tokens per expert since the previous save (JSON, CSV or router JSONL)");
  app.add_option("--fast-store", fast_store, "Fast tier folder (e.g. /dev/shm/...)");
  app.add_option("--k-snapshot", k_snapshot, "Experts per layer into the fast tier");
  app.add_option("--k-persist", k_persist, "Experts per layer into the durable store");
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  return tool::run("pec-save", [&] {
    tool::not_implemented("pec-save (issue 5)");
    return 0;
  });
}
