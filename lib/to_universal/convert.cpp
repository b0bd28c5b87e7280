// Conversion drivers: extract to a work folder, union into the universal layout.
#include "to_universal/convert.h"
#include "to_universal/direct.h"


#include <algorithm>
#include <atomic>
#include <climits>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>

#include <tbb/parallel_for.h>

#include "core/allocator.h"
#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/staging.h"
#include "io/shape.h"
#include "io/zip/zip_reader.h"
#include "io/torch/torch_file.h"
#include "formats/detect.h"
#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/storage_tags.h"
#include "formats/universal/manifest.h"
#include "to_universal/extract.h"
#include "to_universal/master_image.h"
#include "parallel/mpi_session.h"
#include "parallel/share.h"
#include "parallel/staging.h"
#include "parallel/threads.h"
#include "to_universal/save.h"
#include "to_universal/shard_reader.h"
#include "to_universal/union_executor.h"
#include "to_universal/union_fragments.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {

using pickle::Value;
using pickle::ValuePtr;

nlohmann::json RunSummary::to_json() const {
  return {{"tool", tool},
          {"output", output},
          {"params", params},
          {"files_written", files_written},
          {"bytes_read", bytes_read},
          {"bytes_written", bytes_written},
          {"seconds", seconds},
          {"peak_rss_bytes", peak_rss_bytes},
          {"mpi_ranks", ranks},
          {"threads", threads},
          {"buffers", buffers},
          {"items", items},
          {"not_carried", not_carried}};
}

namespace {

using Clock = std::chrono::steady_clock;
using pickle::Kind;

// The key under which ucp-extract records, in each fragment file, the tag of the save it comes from.
constexpr const char* kFragmentSourceKey = "ucpkit_source_tag";

// Large buffers come and go for every parameter; keeping them in the heap roughly halves the
// conversion time (core/allocator.h).
void tune_allocator() { keep_large_buffers_on_heap({.one_arena = true, .trim_threshold = INT_MAX}); }

void copy_file(const std::string& from, const fs::path& to) { copy_file_contents(from, to.string()); }

std::string shape_json_key(const std::vector<int64_t>& s) { return nlohmann::json(s).dump(); }

}  // namespace

// ------------------------------------------------------------------ extract -> work folder

// The fragment files of a work folder, grouped by the shard file they are read from.
namespace {
struct WorkJob {
  size_t param;
  int tp;
  size_t index;
};

// The work folder's plan: one fragment file per (param, tp, partition); and the fragments to write,
// grouped by the source shard they are read from. Every rank computes the same.
struct WorkPlan {
  ExtractPlan out;
  std::map<int, std::vector<WorkJob>> by_source;
};

WorkPlan work_plan(const ExtractPlan& plan) {
  WorkPlan w{plan, {}};
  ExtractPlan& out = w.out;
  auto& by_source = w.by_source;
  out.files.clear();
  for (size_t i = 0; i < plan.params.size(); ++i) {
    const auto& p = plan.params[i];
    for (int t = 0; t < (int)p.fragments.size(); ++t)
      for (size_t k = 0; k < p.fragments[t].size(); ++k) {
        const auto& f = p.fragments[t][k];
        by_source[f.file].push_back({i, t, k});
        auto& nf = out.params[i].fragments[t][k];
        nf.file = out.add_file("fragments/" + param_folder(p.name) + "/tp" + std::to_string(t) + ".part" +
                               std::to_string(f.part) + ".pt");
        nf.group = -1;
        nf.offset = 0;
      }
    if (p.step_file >= 0 && !p.fragments.empty() && !p.fragments[0].empty()) {
      out.params[i].step_file = out.params[i].fragments[0][0].file;
      out.params[i].step_group = -1;
    }
  }
  return w;
}
}  // namespace

ExtractStats write_work_folder(const ExtractPlan& plan, const std::string& work_dir, int threads, bool sync,
                               bool overwrite, const Reporter& reporter) {
  auto& mpi = parallel::MpiSession::get();
  parallel::RankFailure failed(mpi);
  ExtractStats stats;
  WorkPlan w = work_plan(plan);
  ExtractPlan& out = w.out;
  auto& by_source = w.by_source;

  // Staging folder and every fragment folder: created by rank 0, shared through its name.
  parallel::CollectiveStaging staging(failed, work_dir, overwrite, "ucp", reporter.verbose, sync, [&](const fs::path& s) {
    make_folder(s / "fragments");
    make_folder(s / "model_states");
    for (const auto& p : plan.params) make_folder(s / "fragments" / param_folder(p.name));
  });
  const auto drop_staging = staging.cleanup();
  const fs::path staged = staging.path();

  // Source shards split across ranks by the bytes they hold (largest first onto the least-loaded
  // rank), TBB threads over this rank's shards.
  std::vector<int> sources;
  std::vector<uint64_t> sizes;
  for (const auto& [f, jobs] : by_source) {
    sources.push_back(f);
    uint64_t bytes = 0;
    for (const auto& job : jobs) {
      const auto& p = plan.params[job.param];
      bytes += static_cast<uint64_t>(p.fragments[job.tp][job.index].numel) * 4 * p.states.size();
    }
    sizes.push_back(bytes);
  }
  const std::vector<size_t> mine = parallel::share_of(sizes, mpi.size(), mpi.rank());
  size_t my_files = 0;
  for (size_t si : mine) my_files += by_source[sources[si]].size();

  SourceCache cache(plan.files);
  const std::string source_tag = plan.source.tag.value_or("");
  std::atomic<uint64_t> read{0}, written{0}, count{0};
  Reporter::Bar progress(reporter, "ucp-extract", my_files, mpi.rank() == 0);
  failed.guard([&] {
    parallel::in_arena(threads, [&] {
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, mine.size(), 1),
          [&](const tbb::blocked_range<size_t>& range) {
            for (size_t m = range.begin(); m != range.end(); ++m) {
              const int src = sources[mine[m]];
              uint64_t r = 0;
              for (const auto& job : by_source.at(src)) {
                check_interrupted();
                const auto& p = plan.params[job.param];
                const auto& f = p.fragments[job.tp][job.index];
                auto d = Value::dict();
                for (const auto& state : p.states)
                  d->set_item(state, Value::of_tensor(read_slice(cache, {f}, state, {f.numel}, &r)));
                if (p.step_file >= 0 && f.group >= 0) {
                  // The step of the group this fragment came from (same for every fragment of a shard).
                  if (const ShardView& shard = cache.shard(f.file); shard.has_step(f.group))
                    d->set_item("step", shard.step(f.group));
                }
                const std::string rel = out.files[out.params[job.param].fragments[job.tp][job.index].file];
                const std::string path = (staged / rel).string();
                // The save this fragment comes from: ucp-union compares it with the work folder's plan
                // (fragments of another step copied into a work folder are refused).
                if (!source_tag.empty()) d->set_item(kFragmentSourceKey, Value::str(source_tag));
                formats::deepspeed::tag_storages_cpu(d);
                save_torch_file(path, d);
                written += file_size_or_zero(path);
                ++count;
                progress.advance();
              }
              read += r;
            }
          },
          tbb::simple_partitioner());
    });
  });
  progress.finish();
  failed.guard([&] { staging.sync_own_files(); });
  failed.settle(drop_staging);

  // Rank 0: model files, the common optimizer state, plan.json, then the rename.
  uint64_t common_files = 0;
  failed.guard([&] {
    if (mpi.rank() != 0) return;
    for (size_t i = 0; i < plan.model_files.size(); ++i) {
      check_interrupted();
      const std::string rel = "model_states/" + fs::path(plan.model_files[i]).filename().string();
      copy_file(plan.model_files[i], staged / rel);
      read += file_size_or_zero(plan.model_files[i]);
      written += file_size_or_zero(plan.model_files[i]);
      out.model_files[i] = rel;
    }
    auto root = load_torch(plan.optimizer_state_file);
    save_torch_file((staged / "optimizer_state.pt").string(), common_optimizer_state(root, plan.optimizer_state_file));
    out.optimizer_state_file = "optimizer_state.pt";
    out.optimizer_state_prepared = true;
    write_file_atomic((staged / "plan.json").string(), out.to_json().dump(1));
    written += file_size_or_zero((staged / "optimizer_state.pt").string()) + file_size_or_zero((staged / "plan.json").string());
    common_files = plan.model_files.size() + 2;
    test_pause_if_asked();
    check_interrupted();
    staging.commit();
  });
  failed.settle(drop_staging);
  stats.bytes_read = mpi.sum(read.load());
  stats.bytes_written = mpi.sum(written.load());
  stats.fragments = mpi.sum(count.load());
  stats.files = stats.fragments + mpi.sum(common_files);
  return stats;
}

RunSummary run_extract(const std::string& checkpoint, const std::string& work_dir, const ConvertOptions& options) {
  const auto t0 = Clock::now();
  tune_allocator();
  auto& mpi = parallel::MpiSession::get();
  parallel::RankFailure failed(mpi);
  Reporter::Phase phase(options.reporter, "plan");
  const formats::FolderKind kind = formats::detect(checkpoint);
  if (!kind.is(formats::kDeepSpeed))  // the one format whose union goes through a work folder (this file's)
    throw UsageError("--input " + checkpoint + " is a " + kind.name() +
                     (has_union(kind.format) ? " checkpoint: ucp-union converts it in one step (ucp-extract's work "
                                               "folders are for DeepSpeed shards)"
                                             : " folder: ucp-extract reads DeepSpeed shards"));
  refuse_output_over_input(work_dir, "--output", formats::deepspeed::resolve_checkpoint_dir(checkpoint), "--input");
  ExtractOptions eo;
  eo.patterns_file = options.patterns_file;
  eo.threads = options.threads;
  ExtractPlan plan;
  failed.guard([&] {
    plan = naming_file([&] { return plan_checkpoint(checkpoint, eo); });
    if (!plan.unused_patterns.empty() && !options.allow_unused_patterns)
      throw Error("unused pattern '" + plan.unused_patterns[0] + "' (" + plan.patterns_origin +
                  ") matches no parameter (--allow-unused-patterns to accept)");
  });
  failed.settle("another MPI rank failed while planning");
  phase.next("write fragments");
  auto stats = write_work_folder(plan, work_dir, options.threads, options.sync, options.overwrite, options.reporter);
  RunSummary s;
  s.tool = "ucp-extract";
  s.output = work_dir;
  s.params = plan.params.size();
  s.files_written = stats.files;
  s.bytes_read = stats.bytes_read;
  s.bytes_written = stats.bytes_written;
  s.ranks = mpi.size();
  s.threads = parallel::thread_count(options.threads);
  s.peak_rss_bytes = mpi.max(peak_rss_bytes());
  s.seconds = mpi.max(std::chrono::duration<double>(Clock::now() - t0).count());
  return s;
}

// ------------------------------------------------------------------ union -> universal layout

namespace {

// All TP slices of one state, read into one buffer back to back (TP rank order, each slice's
// fragments in partition order).
struct SliceBuffer {
  DType dtype = DType::Float32;
  std::shared_ptr<Storage> storage;  // filled by the reads, never zero-filled first
  std::vector<size_t> offsets;       // byte offset of each TP slice
  std::span<const uint8_t> bytes() const { return storage->bytes(); }
  int64_t numel() const { return storage->numel(); }
};

SliceBuffer read_slices(SourceCache& cache, const ParamPlan& p, const std::string& state, uint64_t* bytes_read) {
  SliceBuffer b;
  std::vector<std::vector<Tensor>> parts(p.fragments.size());
  size_t total = 0;
  bool first = true;
  for (size_t t = 0; t < p.fragments.size(); ++t)
    for (const auto& f : p.fragments[t]) {
      parts[t].push_back(fragment_tensor(cache, f, state));
      const Tensor& x = parts[t].back();
      if (first) b.dtype = x.dtype();
      first = false;
      if (x.dtype() != b.dtype)
        fail(cache.path(f.file), "parameter " + p.name + ": fragment dtype " + std::string(dtype_name(x.dtype())) +
                                     " differs from " + std::string(dtype_name(b.dtype)));
      total += x.nbytes();
    }
  b.storage = Storage::uninitialized(b.dtype, static_cast<int64_t>(total / dtype_size(b.dtype)));
  uint8_t* out = b.storage->mutable_bytes().data();
  size_t off = 0;
  for (size_t t = 0; t < parts.size(); ++t) {
    b.offsets.push_back(off);
    for (size_t k = 0; k < parts[t].size(); ++k) {
      const Tensor& x = parts[t][k];
      if (!cache.read_into(p.fragments[t][k].file, x, out + off)) {
        x.copy_to(out + off);
        release_pages(x);
      }
      off += x.nbytes();
    }
  }
  *bytes_read += total;
  return b;
}


// Joins one state. Concatenation along dim 0 (and TP = 1) needs no second copy: the slices read
// back to back already are the result, and vocabulary padding is cut by truncating the buffer.
Tensor join_state(const ParamPlan& p, const patterns::ParamRule& rule, const patterns::PatternSet& set,
                  SliceBuffer b, const UnionOptions& uo) {
  const size_t tp = p.tp_shapes.size();
  const size_t es = dtype_size(b.dtype);
  const bool direct = tp == 1 || (rule.kind == patterns::JoinKind::Cat && rule.cat_dim == 0);
  if (direct) {
    std::vector<int64_t> shape = p.tp_shapes[0];
    for (size_t t = 1; t < tp; ++t) {
      const auto& s = p.tp_shapes[t];
      if (s.size() != shape.size() || s.empty() || !std::equal(s.begin() + 1, s.end(), shape.begin() + 1))
        throw Error("parameter " + p.name + ": shape mismatch between fragments: " + shape_json_key(p.tp_shapes[0]) +
                    " vs " + shape_json_key(s) + " (joined along dim 0)");
      shape[0] += s[0];
    }
    if (rule.vocab) {
      if (!set.original_vocab_size)
        throw Error("parameter " + p.name + " matches a vocabulary pattern but the patterns give no original_vocab_size");
      if (shape.empty() || *set.original_vocab_size > shape[0])
        throw Error("parameter " + p.name + ": original_vocab_size " + std::to_string(*set.original_vocab_size) +
                    " exceeds its " + (shape.empty() ? std::string("0") : std::to_string(shape[0])) + " rows");
      shape[0] = *set.original_vocab_size;
      b.storage->truncate(numel_of(shape));
    }
    auto strides = Tensor::contiguous_strides(shape);
    return Tensor(std::move(b.storage), 0, std::move(shape), std::move(strides));
  }
  auto storage = std::move(b.storage);
  std::vector<Tensor> slices;
  for (size_t t = 0; t < tp; ++t)
    slices.emplace_back(storage, static_cast<int64_t>(b.offsets[t] / es), p.tp_shapes[t],
                        Tensor::contiguous_strides(p.tp_shapes[t]));
  Tensor joined = union_fragments(p.name, slices, rule, set, uo);
  if (rule.vocab) {
    if (!set.original_vocab_size)
      throw Error("parameter " + p.name + " matches a vocabulary pattern but the patterns give no original_vocab_size");
    joined = strip_padding(p.name, joined, *set.original_vocab_size);
  }
  // A result that still views the read buffer (replicate) is written compactly.
  if (joined.storage() == storage && (joined.storage_offset() != 0 || joined.numel() != storage->numel()))
    joined = joined.contiguous(true);
  return joined;
}

// Two-step mode: every fragment file of `p` must come from the save the work folder's plan.json
// records (its source tag, stamped into each fragment by ucp-extract). Fragments without the stamp
// (work folders of earlier versions) are not checked.
void check_fragment_sources(const ParamPlan& p, SourceCache& cache, const std::string& expect_tag) {
  for (const auto& tp : p.fragments)
    for (const auto& f : tp) {
      if (f.file < 0) continue;
      auto tf = cache.get(f.file);
      const auto v = tf->root && tf->root->kind == Kind::Dict ? tf->root->get(kFragmentSourceKey) : nullptr;
      if (!v) continue;
      const std::string folder = fs::path(cache.path(f.file)).parent_path().string();
      if (v->kind != Kind::Str)
        fail(folder, "fragment of parameter " + escaped_brief(p.name) + " records its source save as a non-string");
      if (v->s != expect_tag)
        fail(folder, "fragment of " + escaped_brief(v->s, 40) + ", but the work folder's plan.json is of " +
                         escaped_brief(expect_tag, 40) + " (fragments of another step or extract)");
    }
}

ParamResult convert_param(const ParamPlan& p, const patterns::PatternSet& set, SourceCache& cache,
                          const fs::path& zero_dir, const UnionOptions& uo, bool flat, const MasterImage& image,
                          const std::vector<std::string>& files, const std::string& expect_tag = std::string()) {
  ParamResult r;
  if (!expect_tag.empty()) check_fragment_sources(p, cache, expect_tag);
  const auto rule = patterns::classify(set, p.name);
  const fs::path dir = zero_dir / param_folder(p.name);
  make_folder(dir);
  formats::universal::UniversalParam& e = r.manifest;
  e.name = p.name;
  e.dtype = "";  // set by each state written below (empty when none)
  for (const auto& state : p.states) {
    Tensor joined;
    ValuePtr value;
    if (flat) {  // ds_to_universal's ZeRO-3 (TP = 1) output: the bare 1-D tensor (DP padding dropped)
      SliceBuffer b = read_slices(cache, p, state, &r.bytes_read);
      const int64_t n = b.numel();
      joined = Tensor(std::move(b.storage), 0, {n}, {1});
      value = Value::of_tensor(joined);
    } else {
      SliceBuffer b = read_slices(cache, p, state, &r.bytes_read);
      // The module weights must be the rounded fp32 master (a shard of another run otherwise).
      if (state == "fp32" && b.dtype == DType::Float32) image.check(p, b.bytes(), b.offsets, files);
      joined = join_state(p, rule, set, std::move(b), uo);
      value = p.autoep_experts > 0 ? formats::deepspeed::autoep_universal_state(Value::of_tensor(joined), p.autoep_experts)
                                   : state_file_value(joined, rule, set);
    }
    const std::string path = (dir / (state + ".pt")).string();
    save_torch_file(path, value);
    r.bytes_written += file_size_or_zero(path);
    ++r.files;
    e.states[state] = {"zero/" + param_folder(p.name) + "/" + state + ".pt", written_crc32(path, joined)};
    e.shape = joined.shape();
    e.dtype = dtype_name(joined.dtype());
  }
  if (p.step_file >= 0) {
    const std::string path = (dir / "step.pt").string();
    auto step = read_step(cache, p.step_file, p.step_group);
    formats::deepspeed::tag_storages_cpu(step);  // as ds_to_universal saves it (loaded with map_location='cpu')
    save_torch_file(path, step);
    r.bytes_written += file_size_or_zero(path);
    ++r.files;
  }
  describe_manifest_entry(e, p, rule, flat);
  return r;
}


}  // namespace

void describe_manifest_entry(formats::universal::UniversalParam& e, const ParamPlan& p, const patterns::ParamRule& rule,
                             bool flat) {
  e.join = patterns::describe(rule);
  e.tp_shapes = p.tp_shapes;
  e.pp_stage = p.pp_stage;
  e.step = p.step_file >= 0;
  e.patterns = rule.matched;
  if (rule.kind == patterns::JoinKind::Cat || rule.kind == patterns::JoinKind::TwoSubParams) e.cat_dim = rule.cat_dim;
  e.vocab_tensor = rule.vocab && !flat;
  if (flat) {
    e.flat = true;  // the state files hold 1-D tensors; "shape" is the parameter's
    e.shape = p.tp_shapes[0];
  }
  if (p.expert >= 0) e.expert = formats::universal::UniversalExpert{p.moe_layer, p.expert};
  if (p.autoep_experts > 0) {
    e.autoep = formats::universal::UniversalAutoEp{p.moe_layer, p.autoep_experts};
    e.cat_dim = 0;
  }
}

namespace {

// The plan of a union: a work folder's plan.json, or the extract plan of a checkpoint (every rank).
ExtractPlan union_plan(const std::string& input, bool from_work, const std::string& output, const ConvertOptions& options,
                parallel::RankFailure& failed) {
  ExtractPlan plan;
  if (from_work && !options.patterns_file.empty())
    throw UsageError("--patterns " + options.patterns_file + ": " + input +
                     " is a ucp-extract work folder whose patterns were fixed when it was extracted "
                     "(pass --patterns to ucp-extract, or convert the checkpoint in one step)");
  // The folder the data is read from: the work folder, or the checkpoint's global_stepN folder (an
  // output beside it under the same parent, as ds_to_universal's, is fine).
  refuse_output_over_input(output, "--output", from_work ? input : formats::deepspeed::resolve_checkpoint_dir(input), "--input");
  failed.guard([&] {
    if (from_work) {
      plan = load_work_plan(input);
    } else {
      ExtractOptions eo;
      eo.patterns_file = options.patterns_file;
      plan = naming_file([&] { return plan_checkpoint(input, eo); });
    }
    if (!plan.unused_patterns.empty() && !options.allow_unused_patterns)
      throw Error("unused pattern '" + plan.unused_patterns[0] + "' (" + plan.patterns_origin +
                  ") matches no parameter (--allow-unused-patterns to accept)");
  });
  failed.settle("another MPI rank failed while planning");
  return plan;
}

// Rank 0, once every parameter is written: the common optimizer state and the model files into the
// staging folder, and the manifest's fields but its params (union_executor writes it).
void write_union_common_files(const ExtractPlan& plan, const fs::path& staged,
                              formats::universal::UniversalManifest& manifest, CommonFiles& t) {
  const std::string opt_path = (staged / formats::universal::kUniversalOptimizerState).string();
  if (plan.optimizer_state_prepared) {
    copy_file(plan.optimizer_state_file, opt_path);
  } else {
    auto root = load_torch(plan.optimizer_state_file);
    save_torch_file(opt_path, common_optimizer_state(root, plan.optimizer_state_file));
  }
  t.bytes_written += file_size_or_zero(opt_path);
  ++t.files;
  for (const auto& f : plan.model_files) {
    const auto name = fs::path(f).filename();
    copy_file(f, staged / name);
    t.bytes_read += file_size_or_zero(f);
    t.bytes_written += file_size_or_zero(f);
    ++t.files;
    manifest.model_files.push_back(name.string());
  }
  manifest.source = plan.source;
  manifest.patterns_origin = plan.patterns_origin;
  manifest.patterns_set = plan.patterns_json;
}

// latest_universal beside the folder, as ds_to_universal writes it. The output is in place and on
// stable storage by now: a failure here (no inode or space left for the tag) is a warning, so that
// exit 1 keeps meaning "no output" (docs/reliability.md).
// A native-MoE universal folder gets no tag unless asked (--tag-latest-universal): DeepSpeed's own
// load_universal looks expert states up by their local expert name and loads the wrong experts
// without an error (0.19.6; 0.14.5 fails on missing files), so `load_universal: true` must not pick
// the folder up; ucp-load writes the DeepSpeed checkpoint to resume from, and the warning says how.
void tag_latest_universal(const std::string& output, const ExtractPlan& plan, const ConvertOptions& options) {
  if (!options.tag_latest) return;
  const bool native_moe = std::any_of(plan.params.begin(), plan.params.end(), [](const ParamPlan& p) { return p.expert >= 0; });
  if (native_moe && !options.tag_native_moe) {
    options.reporter.warning("native-MoE universal folder: no " + std::string(formats::deepspeed::kLatestUniversalName) +
                             " written (DeepSpeed's load_universal loads the wrong experts from it); resume through "
                             "ucp-load: ucp-load --input " + output + " --output <target_dir> --dp " +
                             std::to_string(plan.source.dp_or_1()) + " --ep " + std::to_string(plan.source.ep_or_1()) +
                             " (the new DP and EP), then load <target_dir> with load_universal off; "
                             "--tag-latest-universal writes the tag anyway");
    return;
  }
  const fs::path target = fs::absolute(output);
  try {
    // Durable unless --no-sync: the file is fsynced before its rename, the folder after it.
    write_file_atomic((target.parent_path() / formats::deepspeed::kLatestUniversalName).string(), target.filename().string(),
                      options.sync);
  } catch (const Error& e) {
    options.reporter.warning(std::string("output written, but not its tag: ") + e.what());
  }
}

}  // namespace

namespace {

// ucp-union of a DeepSpeed checkpoint (one-step mode) or a ucp-extract work folder.
RunSummary run_union_native(const std::string& input, const std::string& output, const ConvertOptions& options) {
  const auto t0 = Clock::now();
  tune_allocator();
  auto& mpi = parallel::MpiSession::get();
  parallel::RankFailure failed(mpi);
  Reporter::Phase phase(options.reporter, "plan");
  const bool from_work = formats::detect(input).is(formats::kWorkFolder);
  const ExtractPlan plan = union_plan(input, from_work, output, options, failed);
  const patterns::PatternSet set = plan.pattern_set();
  // ZeRO-3 with TP = 1 gives bare 1-D tensors; with TP > 1 ds_to_universal joins the TP slices by the
  // patterns (merge_tp_slices), so the output is the ZeRO-1/2 dict form.
  const bool flat = plan.source.flat();
  UnionOptions uo;
  uo.tolerance = options.tolerance;
  // From a work folder: the save its plan.json records, checked against each fragment's stamp.
  const std::string work_tag = from_work ? plan.source.tag.value_or("") : std::string();
  SourceCache cache(plan.files);
  std::unique_ptr<MasterImage> image;  // the model files' module weights, checked against the fp32 masters
  failed.guard([&] { image = std::make_unique<MasterImage>(plan); });
  failed.settle("another MPI rank failed while planning");

  UnionJob job;
  job.params = plan.params.size();
  job.write_phase = "join parameters";
  job.bytes = [&](size_t i) { return plan.params[i].bytes_in(); };
  job.write_param = [&](size_t i, const fs::path& zero_dir) {
    return convert_param(plan.params[i], set, cache, zero_dir, uo, flat && plan.params[i].autoep_experts == 0, *image,
                         plan.files, work_tag);
  };
  job.write_common = [&](const fs::path& staged, formats::universal::UniversalManifest& manifest, CommonFiles& t) {
    write_union_common_files(plan, staged, manifest, t);
  };
  job.after_commit = [&] { tag_latest_universal(output, plan, options); };
  return execute_union(job, output, options, failed, phase, t0);
}

// ucp-union --dry-run of a checkpoint or work folder: its extract plan counted.
UnionCounts count_union_native(const std::string& input, const ConvertOptions& options) {
  const bool from_work = formats::detect(input).is(formats::kWorkFolder);
  ExtractOptions eo;
  eo.patterns_file = options.patterns_file;
  eo.threads = options.threads;
  const ExtractPlan plan = from_work ? load_work_plan(input) : plan_checkpoint(input, eo);
  UnionCounts c;
  c.params = plan.params.size();
  for (const auto& p : plan.params) c.atomic_files += p.states.size() + 1, c.bytes += p.bytes_in();  // <state>.pt, step.pt
  c.files = "manifest.json";
  c.atomic_note = " (zero/<param>/<state>.pt, step.pt)";
  c.from = from_work ? "the work folder" : "the checkpoint";
  c.input_kind = from_work ? "work_folder" : "native";
  return c;
}

[[maybe_unused]] const bool kConvertRegistered = register_union(std::string(formats::kDeepSpeed), run_union_native, count_union_native) &&
                                          register_union(std::string(formats::kWorkFolder), run_union_native, count_union_native);

}  // namespace

uint32_t written_crc32(const std::string& path, const Tensor& t) {
  try {
    ZipReader zip(MappedFile::open(path));
    const ZipRecord* found = nullptr;
    int data_records = 0;
    for (const auto& [name, rec] : zip.records())
      if (name.find("/data/") != std::string::npos) {
        ++data_records;
        if (rec.size == t.nbytes()) found = &rec;
      }
    if (data_records == 1 && found) return found->crc32;
  } catch (const Error&) {
  }
  return tensor_crc32(t);
}

RunSummary union_summary(const std::string& output, size_t params, int threads, uint64_t bytes_read,
                         uint64_t bytes_written, uint64_t files, std::chrono::steady_clock::time_point t0) {
  auto& mpi = parallel::MpiSession::get();
  RunSummary s;
  s.tool = "ucp-union";
  s.output = output;
  s.params = params;
  s.ranks = mpi.size();
  s.threads = threads;
  s.bytes_read = mpi.sum(bytes_read);
  s.bytes_written = mpi.sum(bytes_written);
  s.files_written = mpi.sum(files);
  s.peak_rss_bytes = mpi.max(peak_rss_bytes());
  s.seconds = mpi.max(std::chrono::duration<double>(Clock::now() - t0).count());
  return s;
}

void convert_each(const std::vector<size_t>& mine, int threads, Reporter::Bar& progress,
                  const std::function<void(size_t)>& f) {
  parallel::in_arena(threads, [&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, mine.size(), 1),
        [&](const tbb::blocked_range<size_t>& range) {
          for (size_t k = range.begin(); k != range.end(); ++k) {
            check_interrupted();
            f(mine[k]);
            progress.advance();
          }
        },
        tbb::simple_partitioner());
  });
}

std::vector<formats::universal::UniversalParam> gathered_entries(const std::vector<std::string>& gathered, size_t count) {
  std::vector<formats::universal::UniversalParam> entries(count);
  for (const auto& g : gathered)
    for (const auto& e : nlohmann::json::parse(g))
      entries[e[0].get<size_t>()] = formats::universal::UniversalParam::from_json(e[1], "the manifest entries of the ranks", "entry");
  return entries;
}

}  // namespace ucpkit::to_universal
