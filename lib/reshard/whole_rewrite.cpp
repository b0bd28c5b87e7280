// The registry of whole rewrites and their run (whole_rewrite.h).
#include "reshard/whole_rewrite.h"

#include <chrono>

#include "core/confine.h"
#include "core/registry.h"
#include "core/reporter.h"
#include "parallel/mpi_session.h"
#include "parallel/staging.h"

namespace ucpkit::reshard {
namespace {

NamedTable<WholeRewrite>& table() {
  static NamedTable<WholeRewrite> t;
  return t;
}

std::string key_of(std::string_view input_kind, OutputFormat format) {
  return std::string(input_kind) + " -> " + std::string(output_format_name(format));
}

}  // namespace

bool register_whole_rewrite(std::string_view input_kind, OutputFormat format, WholeRewrite rewrite) {
  return table().set(key_of(input_kind, format), std::move(rewrite));
}

WholeRewrite whole_rewrite_for(const formats::FolderKind& kind, OutputFormat format) {
  return table().find(key_of(kind.name(), format));
}

nlohmann::json run_whole_rewrite(const WholeRewrite& rw, const LoadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto& mpi = parallel::MpiSession::get();
  parallel::RankFailure failed(mpi);
  refuse_output_over_input(options.output, "--output", options.input, "--input");
  parallel::CollectiveStaging staging(failed, options.output, options.overwrite, "ucp-load", options.reporter.verbose,
                                      options.sync);
  nlohmann::json written;
  failed.guard([&] {
    if (mpi.rank() == 0) written = rw.write(options, staging.path().string());
  });
  failed.settle();
  staging.finish(failed);
  nlohmann::json j = {{"tool", "ucp-load"}, {"output", options.output},
                      {"format", std::string(output_format_name(options.format))}, {"route", "whole"}};
  j.update(written);
  j["seconds"] = mpi.max(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  j["peak_rss_bytes"] = mpi.max(peak_rss_bytes());
  j["mpi_ranks"] = mpi.size();
  return j;
}

}  // namespace ucpkit::reshard
