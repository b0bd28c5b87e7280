// ucp-load's per-rank plan: target flavour, files or exchange mode, verification and file shares.
#include "reshard/load_plan.h"

#include "reshard/load.h"
#include "reshard/output_writer.h"
#include "parallel/share.h"

namespace ucpkit::reshard {

TargetLayout resolve_target(const TargetLayout& target, OptimizerKind kind, const ModelInfo& model) {
  TargetLayout t = target;
  switch (kind) {
    case OptimizerKind::Zero: t.bf16_optimizer = false; break;
    case OptimizerKind::Bf16: t.bf16_optimizer = true; break;
    case OptimizerKind::Auto:
      t.bf16_optimizer = t.dtype == DType::BFloat16 &&
                         (t.zero_stage == 0 || (t.zero_stage == 1 && model.source_bf16_optimizer));
      break;
  }
  return t;
}

bool uses_exchange(OutputFormat format, ExchangeMode mode, int ranks) {
  return output_writer(format).takes_exchange() &&
         (mode == ExchangeMode::Exchange || (mode == ExchangeMode::Auto && ranks > 1));
}

const char* file_job_kind_name(FileJob::Kind k) {
  switch (k) {
    case FileJob::Model: return "model";
    case FileJob::Zero3Model: return "zero3_model";
    case FileJob::Optim: return "optim";
  }
  return "?";
}

std::vector<FileJob> file_jobs(const ModelInfo& model, const UcpInfo& plan, const formats::deepspeed::VersionLine* line) {
  std::vector<FileJob> jobs;
  const uint64_t es = dtype_size(plan.target.dtype);
  const bool zero3 = plan.target.zero_stage == 3;
  for (const auto& mr : plan.mp_ranks) {
    uint64_t numel = 0, part = 0;
    for (const auto& g : mr.groups) {
      numel += g.numel;
      part += g.partition;
    }
    if (!zero3) jobs.push_back({FileJob::Model, mr.mp, 0, numel * es * (mr.layers.empty() ? 1 : 2), {}});
    for (int d = 0; d < plan.target.dp; ++d) {
      if (zero3) jobs.push_back({FileJob::Zero3Model, mr.mp, d, 0, {}});
      jobs.push_back({FileJob::Optim, mr.mp, d, part * 4 * model.states.size(), {}});
    }
  }
  const auto facts = plan.files(model.native_moe);
  for (auto& j : jobs) j.files = files_of(facts, j, line);
  return jobs;
}

std::vector<std::string> files_of(const formats::deepspeed::TargetFiles& t, const FileJob& j,
                                  const formats::deepspeed::VersionLine* line) {
  if (j.kind == FileJob::Model) return formats::deepspeed::expected_model_files(t, j.mp, line);
  const auto rank = formats::deepspeed::expected_rank_files(t, j.dp, j.mp);  // [ZeRO-3 model file,] optimizer shard
  if (j.kind == FileJob::Optim) return {rank.back()};
  return {rank.front()};
}

std::vector<char> verify_mask(const ModelInfo& model, int ranks, int rank) {
  std::vector<uint64_t> sizes;
  for (const auto& p : model.params) sizes.push_back(4 * model.states.size() * static_cast<uint64_t>(p.stored_numel));
  const auto owner = parallel::assign_by_size(sizes, ranks);
  std::vector<char> mask(model.params.size());
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = owner[i] == rank;
  return mask;
}

size_t LoadPlan::my_files() const {
  size_t n = 0;
  for (size_t k : my_jobs) n += jobs[k].files.size();
  return n;
}

nlohmann::json LoadPlan::to_json(const ModelInfo& model) const {
  nlohmann::json verified = nlohmann::json::array(), js = nlohmann::json::array();
  for (size_t i = 0; i < verify_mask.size(); ++i)
    if (verify_mask[i]) verified.push_back(model.params[i].name);
  for (size_t k = 0; k < jobs.size(); ++k)
    js.push_back({{"kind", file_job_kind_name(jobs[k].kind)}, {"mp_rank", jobs[k].mp}, {"dp_rank", jobs[k].dp},
                  {"bytes", jobs[k].bytes}, {"rank", job_ranks[k]}, {"files", jobs[k].files}});
  return {{"format", std::string(output_format_name(format))},
          {"direct", direct},
          {"verify", verify},
          {"mode", exchange ? "exchange" : "files"},
          {"verify_first", verify_first},
          {"verified_by_this_rank", verified},
          {"jobs", js},
          {"my_jobs", my_jobs}};
}

LoadPlan plan_load(const LoadOptions& options, const ModelInfo& model, const UcpInfo& plan,
                   const formats::deepspeed::VersionLine* line, bool direct, int ranks, int rank, bool torch_dist) {
  LoadPlan p;
  p.format = options.format;
  p.direct = direct;
  // A torch_dist input (--template) has no universal checksums to check (its items carry CRC-32s, checked
  // as read), and is read in exchange mode: each stored state once, whole (torch_dist_source.h).
  p.verify = torch_dist ? false : direct ? !options.verify_against.empty() : options.verify;
  const OutputWriter& writer = output_writer(options.format);
  p.exchange = torch_dist ? writer.takes_exchange() : uses_exchange(options.format, options.exchange, ranks);
  p.verify_first = p.verify && !p.exchange;
  if (p.verify_first) p.verify_mask = verify_mask(model, ranks, rank);
  if (writer.writes_file_jobs() && !p.exchange) {
    p.jobs = file_jobs(model, plan, line);
    std::vector<uint64_t> sizes;
    for (const auto& j : p.jobs) sizes.push_back(j.bytes);
    p.job_ranks = parallel::assign_by_size(sizes, ranks);
    p.my_jobs = parallel::share_of(sizes, ranks, rank);
  }
  return p;
}

}  // namespace ucpkit::reshard
