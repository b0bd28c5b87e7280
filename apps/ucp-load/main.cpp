// ucp-load: universal checkpoint -> native checkpoint for any target parallel layout.
#include "core/exit_release.h"
#include "parallel/mpi_session.h"
#include "tool/cli.h"
#include "tool/ucp_load.h"

namespace {

using namespace ucpkit;

// The target layout's options, whose presence check() needs (the others default to the source's).
struct LayoutOptions {
  CLI::Option *tp, *pp, *dp, *zero_stage, *ep, *dtype;
};

LayoutOptions add_options(CLI::App& app, tool::UcpLoadOptions& o) {
  auto& l = o.load;
  app.add_option("--input", l.input,
                 "Universal checkpoint folder, a native DeepSpeed checkpoint (global_stepN folder or its parent "
                 "with latest) converted directly without a universal checkpoint, a PyTorch DCP / Megatron-Core "
                 "torch_dist folder, or a Hugging Face model folder (docs/hf.md)")
      ->required();
  app.add_option("--verify-against", l.verify_against,
                 "Native input: compute the universal checksums on the way and compare them with this universal "
                 "checkpoint's manifest.json (or folder); nothing is renamed into place on a mismatch");
  app.add_option("--output", l.output, "Target checkpoint folder");
  app.add_option("--template", l.template_dir,
                 "--input is a Megatron-Core torch_dist checkpoint: the Megatron-DeepSpeed universal folder of the "
                 "same model (ucp-union of its DeepSpeed checkpoint, or that folder's --to-names megatron-core "
                 "output) giving names, model files and DeepSpeed's optimizer state; the values come from --input, "
                 "read once (--format deepspeed, one pass)");
  app.add_option("--model-map", l.model_map,
                 "With --template in Megatron-DeepSpeed names, or --format torch_dist of a DeepSpeed checkpoint or "
                 "its universal folder: the Megatron-Core map file (default: the shipped family that names every "
                 "parameter)");
  LayoutOptions given;
  given.tp = app.add_option("--tp", o.tp, "Target tensor-parallel degree (default: the source's)")
                 ->check(tool::in_range(1, tool::kMaxDegree));
  given.pp = app.add_option("--pp", o.pp, "Target pipeline-parallel degree (default: the source's)")
                 ->check(tool::in_range(1, tool::kMaxDegree));
  given.dp = app.add_option("--dp", o.dp, "Target data-parallel degree (required unless --world-size is given)")
                 ->check(tool::in_range(1, tool::kMaxDegree));
  app.add_option("--world-size", o.world_size, "Target world size: DP = world size / (TP * PP), which must divide")
      ->check(tool::in_range(1, tool::kMaxDegree));
  given.zero_stage = app.add_option("--zero-stage", o.zero_stage, "Target ZeRO stage (0-3; default: the source's)")->check(CLI::Range(0, 3));
  given.ep = app.add_option("--ep", o.ep, "Target expert-parallel degree (default: the source's)")
                 ->check(tool::in_range(1, tool::kMaxDegree));
  app.add_option("--etp", o.etp,
                 "--format torch_dist, an MoE model: target expert tensor-parallel degree (default: the target TP "
                 "when the source's expert TP equals its TP > 1, as Megatron-LM's default; else the source's)")
      ->check(tool::in_range(1, tool::kMaxDegree));
  app.add_option("--megatron-version", l.megatron_version,
                 "--format torch_dist: the Megatron-Core release the output is for (0.16, 0.19.0, ...): before 0.17 "
                 "the common state is written as common.pt, from 0.17 as the common_state item in the DCP files "
                 "(0.17+ reads both); default: the source's form (0.17+ for a DeepSpeed source)");
  app.add_option("--audit", l.audit,
                 "--format hf: write the conversion's audit here as JSON once the output is in place: every tensor "
                 "written with its dtype, shape, SHA-256, source tensors and transform; totals; dtype changes. A Hugging "
                 "Face input with another --format: the import's audit, one record per Megatron-Core parameter (docs/hf.md)");
  app.add_option("--hf-experts", o.hf_experts,
                 "--format hf, MoE models: 'per-expert' (default) writes each expert's tensors "
                 "(block_sparse_moe.experts.{E}.w1 / mlp.experts.{E}.gate_proj ...), as save_pretrained writes them and "
                 "transformers 4, 5 and vLLM read them; 'fused' one tensor per layer and projection (mlp.experts.gate_up_proj "
                 "[E, 2I, H], down_proj [E, H, I]), transformers 5's in-memory layout (docs/hf.md)")
      ->check(CLI::IsMember({"per-expert", "fused"}));
  app.add_option("--param-group", o.param_group,
                 "A Hugging Face input with --format deepspeed: the optimizer's hyperparameters as a JSON object (such as "
                 "'{\"lr\": 2e-5, \"weight_decay\": 0.0}'), set over torch.optim.AdamW's defaults in the fresh optimizer "
                 "state; DeepSpeed's load_checkpoint (load_optimizer_states=True) gives the optimizer these (docs/hf.md)");
  app.add_option("--to-names", o.to_names,
                 "A Hugging Face input with --format deepspeed: 'transformers' (default) writes the DeepSpeed engine "
                 "around transformers' own model; 'megatron-deepspeed' a fresh Megatron-DeepSpeed run's checkpoint "
                 "(GPTModelPipe at any --tp / --pp / --dp; an MoE model as native DeepSpeed MoE at --ep), what "
                 "ucp-union --to-names megatron-deepspeed and ucp-load of its folder write (docs/hf.md)")
      ->check(CLI::IsMember({"transformers", "megatron-deepspeed"}));
  given.dtype = app.add_option("--dtype", o.dtype, "Low-precision weight dtype (default: the source's training precision)")
                    ->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  app.add_flag("--reuse-output", l.reuse_output,
               "When --output exists and its ucpkit_layout.json records what this run would write, write nothing "
               "and exit 0; otherwise convert (replacing it needs --overwrite)");
  app.add_option("--format", o.format,
                 "Output format: deepspeed (the target layout; default), safetensors (the weights in universal "
                 "names, no config.json), dcp (PyTorch DCP), torch_dist (Megatron-Core), hf (a Hugging Face model "
                 "folder transformers loads: config.json and the weights in Hugging Face names, docs/hf.md)")->check(CLI::IsMember(reshard::output_format_names()));
  app.add_option("--device", o.device, "Where to materialize")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--ds-version", l.target.ds_line,
                 "Native MoE: DeepSpeed version line to write (0.14, 0.17.1, 0.19.2, 0.19.3, 0.19.5, or a release "
                 "such as 0.16.5; default: the source's)");
  app.add_flag("--plan", o.plan, "Print the UcpInfo plan as JSON and write nothing");
  app.add_option("--optimizer", o.optimizer, "Optimizer shard flavour: auto, zero, bf16 (BF16_Optimizer)")
      ->check(CLI::IsMember({"auto", "zero", "bf16"}));
  tool::add_threads_option(app, l.threads);
  tool::add_verify_option(app, o.verify, "Check the manifest checksums of atomic tensors and the zip CRC-32 of input files");
  tool::add_dry_run_option(app, o.dry_run);
  app.add_flag("--overwrite", l.overwrite, "Replace an existing output folder (atomically, at the end)");
  app.add_flag("--no-sync", [&l](int64_t) { l.sync = false; }, "Do not flush the output to stable storage before renaming it into place (scratch outputs)");
  app.add_option("--vocab-multiple", l.vocab_multiple, "Pad the vocabulary to a multiple of this times TP")
      ->check(tool::in_range(1, 65536));
  app.add_option("--partition-method", o.partition_method,
                 "PipelineModule sources: which layers each target stage builds, as DeepSpeed's "
                 "PipelineModule(partition_method=...): parameters, uniform or type:<regex> (default: Megatron's "
                 "even split of the transformer blocks for a Megatron model, else DeepSpeed's default parameters)");
  app.add_option("--layer-types", o.layer_types,
                 "PipelineModule sources: a file of the model's layer class names in order, one per line (what "
                 "type:<regex> matches, as DeepSpeed's _find_layer_type: LayerSpec typename, module class, function "
                 "name); needed by --partition-method type:<regex>");
  app.add_option("--sub-group-size", l.target.sub_group_size,
                 "ZeRO-3: the job's zero_optimization.sub_group_size (elements; DeepSpeed's default 1e9)")
      ->check(tool::in_range(1, 1e12));
  tool::add_size_option(app, "--shard-size", o.shard_size, "safetensors shard size limit (a size: 5G, 512M)",
                        {{"--shard-size-gb", 1e9}});
  app.add_option("--exchange", o.exchange,
                 "How atomic tensors reach the files: 'on' reads each atomic tensor once in total (its owner "
                 "rank, checksum in the same pass) and exchanges slices over MPI batch by batch; 'off' lets each "
                 "rank read what its own files need; 'auto' (default) is on under mpirun -np > 1")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  tool::add_size_option(app, "--batch", o.batch, "--exchange: atomic bytes per batch (a size; bounds memory per rank)",
                        {{"--batch-mb", 1 << 20}});
  app.add_option("--pp-rank", o.pp_rank, "--device cuda: pipeline rank to materialize")
      ->check(tool::in_range(0, tool::kMaxDegree - 1));
  app.add_option("--tp-rank", o.tp_rank, "--device cuda: tensor rank to materialize")
      ->check(tool::in_range(0, tool::kMaxDegree - 1));
  app.add_option("--dp-rank", o.dp_rank, "--device cuda: data-parallel rank to materialize (MPI rank under mpirun)")
      ->check(tool::in_range(0, tool::kMaxDegree - 1));
  return given;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a DeepSpeed checkpoint for a target layout from a universal checkpoint", "ucp-load"};
  tool::CommonOptions common;
  tool::UcpLoadOptions o;
  const LayoutOptions layout = add_options(app, o);
  if (int rc = tool::parse_checkpoint_tool(app, argc, argv, common); rc >= 0) return rc;
  o.args = tool::arguments(argc, argv);
  o.given = {layout.tp->count() > 0, layout.pp->count() > 0,         layout.dp->count() > 0,
             layout.zero_stage->count() > 0, layout.ep->count() > 0, layout.dtype->count() > 0};
  set_release_at_exit(true);  // one conversion, then exit: its largest tables are left to the exit to free
  const int rc = tool::run("ucp-load", [&] {
    o.check();
    return tool::print_result("ucp-load", tool::run_ucp_load(o), common.json);
  });
  parallel::die_if_interrupted();  // staging folder removed: die as the signal asked
  return rc;
}
