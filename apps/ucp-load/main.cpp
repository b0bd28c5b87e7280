// ucp-load: universal checkpoint -> native checkpoint for any target parallel layout.
#include <iostream>

#include "core/error.h"
#include "gpu/device_load.h"
#include "io/dtype.h"
#include "reshard/direct_source.h"
#include "reshard/layout_record.h"
#include "reshard/load.h"
#include "io/torch/verify.h"
#include "tool/cli.h"
#include "tool/dry_run.h"
#include "parallel/mpi_session.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Write a DeepSpeed checkpoint for a target layout from a universal checkpoint", "ucp-load"};
  tool::CommonOptions common;
  reshard::LoadOptions opt;
  opt.reporter = tool::console_reporter();
  std::string dtype = "bf16", device = "cpu", optimizer = "auto";
  int tp = 1, pp = 1, dp = 1, zero = 1, ep = 1, pp_rank = 0, tp_rank = 0, dp_rank = 0;
  bool plan = false, no_verify = false;
  uint64_t shard_size = 5000000000, batch = 256 << 20;
  std::string exchange = "auto";
  std::string format(reshard::output_format_name(opt.format));
  app.add_option("--input", opt.input,
                 "Universal checkpoint folder, or a native DeepSpeed checkpoint (global_stepN folder or its parent "
                 "with latest) converted directly without a universal checkpoint")
      ->required();
  app.add_option("--verify-against", opt.verify_against,
                 "Native input: compute the universal checksums on the way and compare them with this universal "
                 "checkpoint's manifest.json (or folder); nothing is renamed into place on a mismatch");
  app.add_option("--output", opt.output, "Target checkpoint folder");
  auto* o_tp = app.add_option("--tp", tp, "Target tensor-parallel degree (default: the source's)");
  auto* o_pp = app.add_option("--pp", pp, "Target pipeline-parallel degree (default: the source's)");
  auto* o_dp = app.add_option("--dp", dp, "Target data-parallel degree (required unless --world-size is given)");
  int64_t world_size = 0;
  app.add_option("--world-size", world_size, "Target world size: DP = world size / (TP * PP), which must divide")
      ->check(CLI::PositiveNumber);
  auto* o_zero = app.add_option("--zero-stage", zero, "Target ZeRO stage (0-3; default: the source's)")->check(CLI::Range(0, 3));
  auto* o_ep = app.add_option("--ep", ep, "Target expert-parallel degree (default: the source's)");
  auto* o_dtype = app.add_option("--dtype", dtype, "Low-precision weight dtype (default: the source's training precision)")
                      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  app.add_flag("--reuse-output", opt.reuse_output,
               "When --output exists and its ucpkit_layout.json records what this run would write, write nothing "
               "and exit 0; otherwise convert (replacing it needs --overwrite)");
  app.add_option("--format", format, "Output format")->check(CLI::IsMember(reshard::output_format_names()));
  app.add_option("--device", device, "Where to materialize")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--ds-version", opt.target.ds_line,
                 "Native MoE: DeepSpeed version line to write (0.14, 0.17.1, 0.19.2, 0.19.3, 0.19.5, or a release "
                 "such as 0.16.5; default: the source's)");
  app.add_flag("--plan", plan, "Print the UcpInfo plan as JSON and write nothing");
  app.add_option("--optimizer", optimizer, "Optimizer shard flavour: auto, zero, bf16 (BF16_Optimizer)")
      ->check(CLI::IsMember({"auto", "zero", "bf16"}));
  tool::add_threads_option(app, opt.threads);
  bool verify = true, dry_run = false;
  tool::add_verify_option(app, verify, "Check the manifest checksums of atomic tensors and the zip CRC-32 of input files");
  tool::add_dry_run_option(app, dry_run);
  app.add_flag("--overwrite", opt.overwrite, "Replace an existing output folder (atomically, at the end)");
  app.add_flag("--no-sync", [&opt](int64_t) { opt.sync = false; }, "Do not flush the output to stable storage before renaming it into place (scratch outputs)");
  app.add_option("--vocab-multiple", opt.vocab_multiple, "Pad the vocabulary to a multiple of this times TP");
  app.add_option("--sub-group-size", opt.target.sub_group_size,
                 "ZeRO-3: the job's zero_optimization.sub_group_size (elements; DeepSpeed's default 1e9)")
      ->check(CLI::PositiveNumber);
  tool::add_size_option(app, "--shard-size", shard_size, "safetensors shard size limit (a size: 5G, 512M)",
                        {{"--shard-size-gb", 1e9}});
  app.add_option("--exchange", exchange,
                 "How atomic tensors reach the files: 'on' reads each atomic tensor once in total (its owner "
                 "rank, checksum in the same pass) and exchanges slices over MPI batch by batch; 'off' lets each "
                 "rank read what its own files need; 'auto' (default) is on under mpirun -np > 1")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  tool::add_size_option(app, "--batch", batch, "--exchange: atomic bytes per batch (a size; bounds memory per rank)",
                        {{"--batch-mb", 1 << 20}});
  app.add_option("--pp-rank", pp_rank, "--device cuda: pipeline rank to materialize");
  app.add_option("--tp-rank", tp_rank, "--device cuda: tensor rank to materialize");
  app.add_option("--dp-rank", dp_rank, "--device cuda: data-parallel rank to materialize (MPI rank under mpirun)");
  tool::add_pickle_options(app);
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  const int rc = tool::run("ucp-load", [&] {
    no_verify = !verify;
    if (shard_size == 0) throw UsageError("--shard-size must be positive");
    if (batch == 0) throw UsageError("--batch must be positive");
    opt.format = *reshard::output_format_from_name(format);
    opt.given = {o_tp->count() > 0, o_pp->count() > 0, o_dp->count() > 0, o_zero->count() > 0, o_ep->count() > 0,
                 o_dtype->count() > 0, world_size};
    const bool layout_given = o_tp->count() && o_pp->count() && o_dp->count() && o_zero->count();
    if (device == "cuda" && !layout_given)
      throw UsageError("--device cuda needs --tp, --pp, --dp and --zero-stage (see --help)");
    if (!plan && device == "cpu" && opt.output.empty()) throw UsageError("--output is required (see --help)");
    opt.target.tp = tp;
    opt.target.pp = pp;
    opt.target.dp = dp;
    opt.target.zero_stage = zero;
    opt.target.ep = ep;
    opt.target.dtype = *dtype_from_name(dtype);
    opt.optimizer = optimizer == "zero" ? reshard::OptimizerKind::Zero
                    : optimizer == "bf16" ? reshard::OptimizerKind::Bf16
                                          : reshard::OptimizerKind::Auto;
    opt.verify = !no_verify;
    if (no_verify) set_verify_files_crc(false);
    opt.shard_bytes = shard_size;
    opt.exchange = exchange == "on"    ? reshard::ExchangeMode::Exchange
                   : exchange == "off" ? reshard::ExchangeMode::Files
                                       : reshard::ExchangeMode::Auto;
    opt.batch_bytes = batch;
    if (exchange == "on" && opt.format != reshard::OutputFormat::DeepSpeed) throw UsageError("--exchange on applies to --format deepspeed");
    const bool root = parallel::MpiSession::get().rank() == 0;
    if (dry_run && !plan) {
      auto j = reshard::plan_json(opt);
      if (!root) return 0;
      if (j.contains("from_source") && !j["from_source"].empty()) tool::info(reshard::describe_source_defaults(j["from_source"]));
      tool::print_dry_run("ucp-load", tool::load_dry_run(j, opt.output), common.json);
      return 0;
    }
    if (plan) {
      auto j = reshard::plan_json(opt);
      if (root) std::cout << j.dump(1) << "\n";
      if (root && j.contains("from_source") && !j["from_source"].empty()) tool::info(reshard::describe_source_defaults(j["from_source"]));
      return 0;
    }
    if (!opt.verify_against.empty() && reshard::is_universal_input(opt.input))
      throw UsageError("--verify-against applies to a native checkpoint input; " + opt.input +
                       " is a universal checkpoint (its own checksums are checked)");
    if (device == "cuda") {
      if (opt.format != reshard::OutputFormat::DeepSpeed) throw UsageError("--device cuda loads the deepspeed layout only");
      if (!reshard::is_universal_input(opt.input))
        throw UsageError("--device cuda reads a universal checkpoint; " + opt.input + " has no manifest.json");
      gpu::DeviceLoadRequest req;
      req.universal_dir = opt.input;
      req.tp = tp, req.pp = pp, req.dp = dp, req.zero_stage = zero;
      req.pp_rank = pp_rank, req.tp_rank = tp_rank, req.dp_rank = dp_rank;
      req.verify = opt.verify;
      auto r = gpu::load_partition_to_device(req);
      nlohmann::json j = {{"tool", "ucp-load"},
                          {"device", r.device},
                          {"bytes_to_device", r.bytes_to_device},
                          {"transfer_seconds", r.seconds},
                          {"gbps", r.gbps},
                          {"end_to_end_seconds", r.end_to_end_seconds},
                          {"end_to_end_gbps", r.end_to_end_gbps},
                          {"baseline_pinned_memcpy_gbps", r.baseline_gbps},
                          {"phase_seconds", r.phase_seconds},
                          {"threads", r.threads},
                          {"partition_crc32", r.partition_crc32}};
      if (common.json) tool::print_json(tool::envelope("ucp-load", nullptr, j));
      tool::info(std::to_string(r.bytes_to_device) + " bytes to GPU " + std::to_string(r.device) + ": transfers " +
                 std::to_string(r.gbps) + " GB/s, end to end " + std::to_string(r.end_to_end_gbps) +
                 " GB/s (pinned cudaMemcpy: " + std::to_string(r.baseline_gbps) + " GB/s)");
      return 0;
    }
    auto s = reshard::run_load(opt);
    if (root) {
      if (common.json) tool::print_json(tool::envelope("ucp-load", s.output, s.to_json()));
      if (!s.from_source.empty()) tool::info(reshard::describe_source_defaults(s.from_source));
      if (s.reused)
        tool::info(opt.output + " already holds this layout (" + reshard::kLayoutRecordName + "): reused, nothing written");
      else
        tool::info(std::to_string(s.params) + " parameters -> " + opt.output + " (" +
                   std::to_string(s.files_written) + " files)");
    }
    return 0;
  });
  parallel::die_if_interrupted();  // staging folder removed: die as the signal asked
  return rc;
}
