// ucp-union: reduce phase of universal checkpointing (fragments -> atomic universal checkpoint).
#include "parallel/mpi_session.h"
#include "tool/cli.h"
#include "tool/ucp_convert.h"
#include "tool/ucp_names.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Join parameter fragments into a universal checkpoint", "ucp-union"};
  tool::CommonOptions common;
  tool::UcpConvertOptions o;
  tool::UcpNamesOptions names;
  app.add_option("--input", o.input, "Work folder from ucp-extract, a checkpoint folder (one-step mode), a PyTorch DCP or Megatron-Core torch_dist folder, or a Hugging Face model folder (config.json + safetensors, docs/hf.md)")
      ->required();
  app.add_option("--output", o.output, "Universal checkpoint folder to create")->required();
  app.add_option("--patterns", o.convert.patterns_file, "Pattern file (patterns/*.json) when the checkpoint has none");
  tool::add_threads_option(app, o.convert.threads);
  tool::add_verify_option(app, o.verify, "Check the zip CRC-32 of the input files' records");
  app.add_flag("--no-sync", [&o](int64_t) { o.convert.sync = false; }, "Do not flush the output to stable storage before renaming it into place (scratch outputs)");
  app.add_flag("--tag-latest-universal", o.convert.tag_native_moe,
               "Write latest_universal for a native-MoE universal folder too (DeepSpeed's load_universal loads "
               "the wrong experts from it: resume through ucp-load)");
  app.add_option("--tolerance", o.convert.tolerance, "Accept TP-replicated copies differing by at most this")
      ->check(tool::in_range(0, 1e30, false));
  app.add_flag("--allow-unused-patterns", o.convert.allow_unused_patterns, "Accept patterns that match no parameter");
  app.add_option("--to-names", names.to_names,
                 "megatron-core: write the universal folder in Megatron-Core names (input: a DeepSpeed checkpoint or its "
                 "universal folder); megatron-deepspeed: back from such a folder (docs/megatron-core-mapping.md), or a "
                 "Hugging Face folder (or its import) as a fresh Megatron-DeepSpeed run's (GPTModelPipe; an MoE model "
                 "as native DeepSpeed MoE), which ucp-load --format deepspeed lays out (docs/hf.md); "
                 "transformers: a Hugging Face folder in transformers' own names and order with DeepSpeed engine model "
                 "files, what ucp-load --format deepspeed of it reads (docs/hf.md)");
  app.add_option("--param-group", names.param_group,
                 "With --to-names transformers: the optimizer's hyperparameters as a JSON object ('{\"lr\": 2e-5}'), set "
                 "over torch.optim.AdamW's defaults in the fresh optimizer state (docs/hf.md)");
  app.add_option("--model-map", names.model_map,
                 "Name map for --to-names megatron-core (patterns/megatron-core/*.json; default: the shipped family "
                 "that names every parameter)");
  app.add_option("--template", names.template_dir,
                 "For --to-names megatron-deepspeed: the Megatron-DeepSpeed universal folder (or its --to-names "
                 "megatron-core folder) giving names, patterns and model files, for an input without them (ucp-union "
                 "of a torch_dist save)");
  app.add_option("--audit", o.convert.audit,
                 "A Hugging Face input: write the import's audit here as JSON once the output is in place: every "
                 "Megatron-Core parameter with its dtype, shape, SHA-256 of its weights, the Hugging Face tensors it is "
                 "made of and how they join; totals, dtype changes, experts per layer (docs/hf.md)");
  tool::add_overwrite_option(app, o.convert.overwrite, "Replace an existing output folder (atomically, at the end)");
  tool::add_dry_run_option(app, o.dry_run);
  if (int rc = tool::parse_checkpoint_tool(app, argc, argv, common); rc >= 0) return rc;
  const int rc = tool::run("ucp-union", [&] {
    o.check();
    tool::check_names_options(o, names);
    if (!names.to_names.empty()) return tool::print_result("ucp-union", tool::run_ucp_union_names(o, names), common.json);
    return tool::print_result("ucp-union", tool::run_ucp_union(o), common.json);
  });
  parallel::die_if_interrupted();  // staging folder removed: die as the signal asked
  return rc;
}
