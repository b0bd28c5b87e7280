// ucp-info: describe a checkpoint (native DeepSpeed of any version line, ucp-extract work folder,
// universal, PEC store) without converting it: layout, step, DeepSpeed line, parameters, experts,
// dtypes, sizes and the readers' consistency checks (lib/inspect/info.h).
#include "tool/cli.h"
#include "tool/ucp_inspect.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Describe a checkpoint folder without converting it: layout, step, DeepSpeed version line, parameters, "
               "experts, dtypes, sizes, and the consistency checks the readers do",
               "ucp-info"};
  tool::CommonOptions common;
  tool::UcpInfoOptions o;
  app.add_option("input,--input", o.input,
                 "Checkpoint folder: global_stepN or its parent with `latest`, a ucp-extract work folder, a universal "
                 "checkpoint (manifest.json), or a PEC store")
      ->required();
  tool::add_verify_option(app, o.info.verify,
                          "Also check checksums: zip CRC-32 of every record read, universal crc32s, PEC object digests");
  if (int rc = tool::parse_checkpoint_tool(app, argc, argv, common); rc >= 0) return rc;
  return tool::run("ucp-info", [&] {
    o.check();
    return tool::print_result("ucp-info", tool::run_ucp_info(o), common.json);
  });
}
