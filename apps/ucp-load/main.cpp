// ucp-load: universal checkpoint -> native checkpoint for any target parallel layout.
#include "tool/cli.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Write a DeepSpeed checkpoint for a target layout from a universal checkpoint", "ucp-load"};
  tool::CommonOptions common;
  std::string input, output, dtype = "bf16", format = "deepspeed", device = "cpu";
  int tp = 1, pp = 1, dp = 1, zero = 1, ep = 1;
  bool plan = false;
  app.add_option("--input", input, "Universal checkpoint folder")->required();
  app.add_option("--output", output, "Target checkpoint folder")->required();
  app.add_option("--tp", tp, "Target tensor-parallel degree")->required();
  app.add_option("--pp", pp, "Target pipeline-parallel degree")->required();
  app.add_option("--dp", dp, "Target data-parallel degree")->required();
  app.add_option("--zero-stage", zero, "Target ZeRO stage (0-3)")->required()->check(CLI::Range(0, 3));
  app.add_option("--ep", ep, "Target expert-parallel degree");
  app.add_option("--dtype", dtype, "Low-precision weight dtype")->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  app.add_option("--format", format, "Output format")->check(CLI::IsMember({"deepspeed", "safetensors"}));
  app.add_option("--device", device, "Where to materialize")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--plan", plan, "Print the UcpInfo plan as JSON and write nothing");
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  return tool::run("ucp-load", [&] {
    tool::not_implemented("ucp-load (issue 4)");
    return 0;
  });
}
