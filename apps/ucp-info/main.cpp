// ucp-info: describe a checkpoint (native DeepSpeed of any version line, ucp-extract work folder,
// universal, PEC store) without converting it: layout, step, DeepSpeed line, parameters, experts,
// dtypes, sizes and the readers' consistency checks (lib/inspect/info.h).
#include <iostream>

#include "core/error.h"
#include "inspect/info.h"
#include "tool/cli.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Describe a checkpoint folder without converting it: layout, step, DeepSpeed version line, parameters, "
               "experts, dtypes, sizes, and the consistency checks the readers do",
               "ucp-info"};
  tool::CommonOptions common;
  std::string input;
  inspect::InfoOptions opt;
  app.add_option("input,--input", input,
                 "Checkpoint folder: global_stepN or its parent with `latest`, a ucp-extract work folder, a universal "
                 "checkpoint (manifest.json), or a PEC store")
      ->required();
  tool::add_verify_option(app, opt.verify,
                          "Also check checksums: zip CRC-32 of every record read, universal crc32s, PEC object digests");
  tool::add_pickle_options(app);
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  return tool::run("ucp-info", [&] {
    const auto info = inspect::describe(input, opt);
    if (common.json) {
      tool::print_json(tool::envelope("ucp-info", nullptr, info.to_json()));
    } else if (tool::verbosity() >= 0) {
      std::cout << info.text();
    }
    if (const auto* failed = info.first_failure()) throw Error(failed->error);
    return 0;
  });
}
