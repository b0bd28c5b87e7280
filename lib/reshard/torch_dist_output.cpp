// ucp-load --format torch_dist: a Megatron-Core-named universal folder (docs/formats-megatron-core.md,
// "Universal names") written as a Megatron-Core torch_dist checkpoint with the fully_reshardable
// distributed-optimizer state, as Megatron-LM's save_checkpoint lays it out:
//   OUT/latest_checkpointed_iteration.txt       the iteration (training/checkpointing.py:340), or "release"
//   OUT/iter_{N:07d}/.metadata, __{rank}_0.distcp  the DCP save (formats/dcp/writer), keys and chunks
//                                                 per rank of the target mesh (formats/megatron_core/writer)
//                                                 (OUT/release/ for weights without a training run: see TdPrepared)
//   OUT/iter_{N:07d}/metadata.json               {"sharded_backend": "torch_dist", "sharded_backend_version": 1},
//                                                 written last as Megatron does (dist_checkpointing/serialization.py:447-453)
// The common state (the bytes item common_state/shard_0_1: torch.save([dict])) is the folder's
// megatron_core/common_state.pt (ucp-union's record of the source's, in fully_reshardable form) with
// args.{tensor,pipeline,expert}_model_parallel_size, data_parallel_size and world_size set to the
// target; the `._extra_state` objects are written back as recorded. Model tensors in the source's
// dtype (the manifest's) unless --dtype, optimizer states fp32. --tp / --pp / --ep / --dp left out
// are the source's (recorded in manifest.json's source), said on stderr.
// Its OutputWriter (output_writer.h) reads the input itself (a DeepSpeed checkpoint or its universal
// folder through the Megatron-Core view, or a Megatron-Core-named universal folder) and is written by
// one process.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/staging.h"
#include "io/generated_view.h"
#include "io/shape.h"
#include "parallel/mpi_session.h"
#include "parallel/share.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/writer.h"
#include "formats/megatron_core/common_edit.h"
#include "formats/megatron_core/writer.h"
#include "formats/universal/manifest.h"
#include "io/torch/torch_file.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/megatron_core/config.h"
#include "formats/megatron_core/deepspeed_common_state.h"
#include "reshard/megatron_core_input.h"
#include "reshard/model_info.h"
#include "reshard/output_writer.h"
#include "reshard/target_defaults.h"
#include "reshard/universal_reader.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

using formats::megatron_core::EntrySource;
using formats::megatron_core::TorchDistWritePlan;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

constexpr const char* kCommonStateItem = "common_state/shard_0_1";

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw Error(path + ": read failed");
  return b;
}

// torch.save(v) as bytes (a DCP bytes item), through a scratch file in `dir`.
std::vector<uint8_t> torch_save_bytes(const ValuePtr& v, const fs::path& dir) {
  const std::string tmp = (dir / ".ucp-load-bytes-item").string();
  save_torch_file(tmp, v);
  auto b = file_bytes(tmp);
  fs::remove(tmp);
  return b;
}

// Everything the write needs, read and decided before anything is written.
struct TdPrepared : WriterPlan {
  MegatronCoreInput in;  // the manifest, the source's common state and its values
  ValuePtr common;       // the common state written (args rewritten)
  int64_t iteration = 0;
  // Weights without a training run (manifest source.weights_only: a Hugging Face import, a release save):
  // written as Megatron's release checkpoint, folder and tracker "release" (save_checkpoint(release=True),
  // training/checkpointing.py:1012 at core_v0.19.0). Megatron's load_checkpoint with its default flags
  // then takes it as pretrained weights: iteration 0, no optimizer, scheduler or RNG state read, the job's
  // own learning rate and schedule (:2473, :2555-2611); an iter_0000000 folder instead had its optimizer
  // state loaded, whose param groups (a fresh AdamW's, lr 0) no job's match (distrib_optimizer.py:970,
  // KeyError).
  bool release = false;
  // The source kept its common state in common.pt (Megatron-Core before the common_state item, e.g.
  // core_v0.16.1; manifest source.torch_dist.legacy_common_pt): written the same way, or its Megatron
  // cannot open the output (FileNotFoundError ... common.pt).
  bool legacy_common = false;
  formats::megatron_core::WriteLayout layout;
  nlohmann::json from_source = nlohmann::json::object();
  nlohmann::json target;
  TorchDistWritePlan plan;
};

TdPrepared prepare_torch_dist(const LoadOptions& o) {
  TdPrepared p;
  p.in = open_megatron_core_input(o, "torch_dist");
  p.common = p.in.common;
  const std::string& common_path = p.in.common_path;
  p.iteration = formats::megatron_core::common_iteration(p.common);
  p.release = p.in.manifest.source.weights_only.value_or(false);
  const auto& facts = p.in.manifest.source.facts;
  if (const auto td = facts.find("torch_dist"); td != facts.end() && td->is_object())
    p.legacy_common = td->value("legacy_common_pt", false);
  if (!o.megatron_version.empty()) {
    p.legacy_common = formats::megatron_core::writes_legacy_common(o.megatron_version);
  }

  // The target layout: what the command line gives, else the source's (args, else manifest source).
  const auto& src = p.in.manifest.source;
  formats::megatron_core::ArgsFacts fallback;
  fallback.tp = src.tp_or_1(), fallback.pp = src.pp_or_1(), fallback.ep = src.ep_or_1(), fallback.dp = src.dp_or_1();
  const auto args = formats::megatron_core::args_facts(p.common, common_path, fallback);
  auto& m = p.layout.mesh;
  auto pick = [&](bool given, int value, int64_t source, const char* name) {
    if (given) return static_cast<int64_t>(value);
    p.from_source[name] = source;
    return source;
  };
  m.tp = pick(o.given.tp, o.target.tp, args.tp, "tp");
  m.pp = pick(o.given.pp, o.target.pp, args.pp, "pp");
  m.ep = pick(o.given.ep, o.target.ep, args.ep, "ep");
  if (o.given.dp) {
    m.dp = o.target.dp;
    if (o.given.world_size > 0 && o.given.world_size != m.tp * m.pp * m.dp)
      throw UsageError("--world-size " + std::to_string(o.given.world_size) + " is not TP * PP * DP = " +
                       std::to_string(m.tp * m.pp * m.dp));
  } else if (o.given.world_size > 0) {
    if (o.given.world_size % (m.tp * m.pp) != 0)
      throw UsageError("--world-size " + std::to_string(o.given.world_size) + " is not a multiple of TP * PP = " +
                       std::to_string(m.tp * m.pp));
    m.dp = o.given.world_size / (m.tp * m.pp);
  } else {
    m.dp = args.dp;
    p.from_source["dp"] = m.dp;
  }
  // Expert tensor parallelism: --etp, else the source's rule (target_expert_tp); the expert grid
  // (ETP x EP x expert DP x PP) must tile the world as Megatron's parallel_state requires, which is the
  // only rule for EP: with ETP below TP, EP may exceed DP (TP 2 x DP 2 holds EP 4 at ETP 1).
  int64_t etp = 1;
  if (args.num_experts > 0) {
    etp = o.target.etp > 0 ? o.target.etp : formats::megatron_core::target_expert_tp(args.etp, args.tp, m.tp);
    if (o.target.etp <= 0 && etp != args.etp) p.from_source["etp"] = etp;
    if ((m.tp * m.dp) % (etp * m.ep) != 0)
      throw UsageError("torch_dist: expert TP " + std::to_string(etp) + " x EP " + std::to_string(m.ep) +
                       " does not divide TP x DP = " + std::to_string(m.tp * m.dp) +
                       " (Megatron's expert grid tiles the ranks of a pipeline stage)");
  } else if (o.target.etp > 0) {
    throw UsageError("--etp: " + p.in.manifest_path + " is not an MoE model (args.num_experts 0)");
  } else if (m.ep > 1 && m.dp % m.ep != 0) {
    throw UsageError("torch_dist: --ep " + std::to_string(m.ep) + " must divide DP " + std::to_string(m.dp) +
                     " (expert parallelism within the data-parallel ranks)");
  }
  // Megatron's own argument checks (training/arguments.py: heads and query groups split over TP): a
  // layout it cannot build is refused here, not written for its loader to reject.
  if (args.num_attention_heads > 0 && args.num_attention_heads % m.tp != 0)
    throw UsageError("torch_dist: --tp " + std::to_string(m.tp) + " does not divide the " +
                     std::to_string(args.num_attention_heads) + " attention heads (Megatron splits heads over TP)");
  if (args.num_query_groups > 0 && args.num_query_groups % m.tp != 0)
    throw UsageError("torch_dist: --tp " + std::to_string(m.tp) + " does not divide the " +
                     std::to_string(args.num_query_groups) + " query groups (Megatron splits query groups over TP)");
  if (args.num_experts > 0 && args.num_experts % m.ep != 0)
    throw UsageError("torch_dist: --ep " + std::to_string(m.ep) + " does not divide the " + std::to_string(args.num_experts) + " experts");
  p.layout.num_layers = args.num_layers;
  p.layout.homogeneous = args.homogeneous;
  p.layout.swiglu = args.swiglu;
  p.layout.both_norm_keys = args.transformer_impl.empty();  // no Megatron run chose a layer spec
  const std::optional<DType> source_dtype = p.in.model_dtype();
  if (o.given.dtype) {
    p.layout.model_dtype = o.target.dtype;
  } else {
    if (!source_dtype) throw UsageError(p.in.manifest_path + " does not record the model dtype: give --dtype");
    p.layout.model_dtype = *source_dtype;
    p.from_source["dtype"] = dtype_option_name(*source_dtype);
  }
  std::set<std::string> states;
  for (const auto& e : p.in.manifest.params)
    for (const auto& [s, f] : e.states) states.insert(s);
  p.layout.optimizer = true;
  for (const char* st : formats::megatron_core::kOptimizerStates)
    p.layout.optimizer = p.layout.optimizer && states.count(formats::megatron_core::universal_state_name(st));

  // The common state for the target: args of the new layout, the optimizer parts Megatron builds for it.
  p.common = pickle::deep_copy(p.common);
  formats::megatron_core::set_target_layout(p.common, m.tp, m.pp, m.ep, m.dp, etp, common_path);

  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& e : p.in.manifest.params) names.push_back(e.name), shapes.push_back(e.shape);
  std::vector<std::string> bytes;
  if (!p.legacy_common) bytes.push_back(kCommonStateItem);
  if (p.in.objects)
    for (const auto& [k, v] : p.in.objects->entries)
      if (k && k->is(Kind::Str)) bytes.push_back(k->s);
  bytes.insert(bytes.end(), p.in.extra_keys.begin(), p.in.extra_keys.end());
  p.plan = formats::megatron_core::plan_torch_dist_write(names, shapes, bytes, p.layout, p.in.manifest_path);
  p.target = {{"tp", m.tp}, {"pp", m.pp}, {"ep", m.ep}, {"etp", etp}, {"dp", m.dp}, {"world", m.tp * m.pp * m.dp},
              {"dtype", dtype_option_name(p.layout.model_dtype)}, {"optimizer_dtype", "fp32"},
              {"optimizer_format", p.layout.optimizer ? "fully_reshardable" : "none"},
              {"homogeneous_layers", p.layout.homogeneous}, {"iteration", p.iteration}, {"release", p.release},
              {"common_state", p.legacy_common ? formats::megatron_core::kLegacyCommonFile : kCommonStateItem}};
  if (args.num_experts > 0)  // the MoE layers' pre-MLP norm: under which layer specs' keys
    p.target["moe_norm_keys"] = p.layout.both_norm_keys ? "local and transformer_engine specs" : "as the source's";
  return p;
}

std::string iteration_folder(const TdPrepared& p) {
  if (p.release) return "release";
  std::string n = std::to_string(p.iteration);
  if (n.size() < 7) n.insert(0, 7 - n.size(), '0');
  return "iter_" + n;
}

// --plan / --dry-run: target, keys, entries and files; writes nothing.
nlohmann::json plan_of(const TdPrepared& p) {
  nlohmann::json j;
  j["format"] = "torch_dist";
  j["from_source"] = p.from_source;
  j["target"] = p.target;
  j["iteration_folder"] = iteration_folder(p);
  size_t tensors = 0, chunks = 0;
  for (const auto& e : p.plan.plan.entries)
    if (!e.is_bytes) ++tensors, chunks += e.chunks.size();
  j["entries"] = p.plan.plan.entries.size();
  j["tensor_entries"] = tensors;
  j["items"] = chunks + (p.plan.plan.entries.size() - tensors);
  auto& keys = j["keys"] = nlohmann::json::array();
  for (const auto& k : p.plan.keys) keys.push_back(nlohmann::json{{"key", k.key}, {"size", k.size}, {"tp_dim", k.tp_dim}, {"swiglu", k.swiglu}});
  auto& files = j["files"] = nlohmann::json::array();
  for (const auto& f : p.plan.plan.files) files.push_back(nlohmann::json{{"file", f.relative_path}, {"rank", f.rank}, {"items", f.items.size()}});
  return j;
}

// Writes the checkpoint into the staging folder `staged` (one process), adding to `r`'s counts.
// The plan's data files rank `rank` of `ranks` writes (a flag per file), balanced by tensor bytes.
std::vector<char> files_of_rank(const formats::dcp::SavePlan& plan, int rank, int ranks) {
  std::vector<uint64_t> sizes;
  for (const auto& f : plan.files) {
    uint64_t n = 0;
    for (const auto& it : f.items) {
      const auto& e = plan.entries[it.entry];
      if (!e.is_bytes) n += static_cast<uint64_t>(numel_of(e.chunks[it.chunk].sizes)) * dtype_size(e.dtype);
    }
    sizes.push_back(n);
  }
  const std::vector<int> owner = parallel::assign_by_size(sizes, ranks);
  std::vector<char> mine(plan.files.size());
  for (size_t f = 0; f < mine.size(); ++f) mine[f] = owner[f] == rank;
  return mine;
}

// Every rank's items to rank 0 (in write order with their plan positions; the plan, every rank's own, names them):
// `result` there holds them all.
void gather_items(formats::dcp::WriteResult& result, parallel::MpiSession& mpi) {
  if (mpi.size() == 1) return;
  nlohmann::json own = nlohmann::json::array();
  for (size_t i = 0; i < result.storage.size(); ++i) {
    const auto& s = result.storage[i];
    own.push_back({s.relative_path, s.offset, s.length, result.order[i].first, result.order[i].second});
  }
  const std::vector<std::string> gathered = mpi.gather(own.dump());
  for (size_t g = 1; g < gathered.size(); ++g)
    for (const auto& j : nlohmann::json::parse(gathered[g])) {
      formats::dcp::StorageInfo s;
      s.relative_path = j[0].get<std::string>();
      s.offset = j[1].get<uint64_t>();
      s.length = j[2].get<uint64_t>();
      result.storage.push_back(std::move(s));
      result.order.push_back({j[3].get<size_t>(), j[4].get<size_t>()});
    }
}

// Rank 0, once every data file is written: .metadata from every rank's items, the source's common.pt where it kept
// one, metadata.json last (Megatron's metadata_finalize_fn), then the tracker at the save root.
void write_save_files(const TdPrepared& p, const formats::dcp::WriteResult& all, const formats::dcp::WriteOptions& wo,
                      const fs::path& root, const fs::path& iter, LoadRun& r) {
  formats::dcp::write_dcp_metadata(p.plan.plan, all, iter.string(), iter.string(), wo);
  uint64_t written = 0;
  if (p.legacy_common) {  // torch.save(common_state_dict), as the source's Megatron saved it
    const std::vector<uint8_t> b = torch_save_bytes(p.common, root);
    write_file_atomic((iter / formats::megatron_core::kLegacyCommonFile).string(), std::string(b.begin(), b.end()));
    written += b.size();
    r.files += 1;
  }
  write_file_atomic((iter / "metadata.json").string(), "{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1}");
  write_file_atomic((root / "latest_checkpointed_iteration.txt").string(), p.release ? "release" : std::to_string(p.iteration));
  for (const fs::path& f : {iter / ".metadata", iter / "metadata.json", root / "latest_checkpointed_iteration.txt"})
    written += fs::file_size(f);
  r.written += written;
  r.files += 3;
}

// Under mpirun the data files are shared among the ranks, balanced by bytes (each rank makes the parameter states its
// files need and writes them), and rank 0 writes .metadata from every rank's items, then the small files: the same
// bytes as one process writes. Each step is settled on every rank before the next.
void write_torch_dist(const LoadOptions& options, const TdPrepared& p, const std::string& staged, LoadRun& r) {
  const fs::path root = staged;
  const fs::path iter = root / iteration_folder(p);
  const int rank = r.mpi.rank(), ranks = r.mpi.size();
  // torch_save_bytes and extra_state_objects make a scratch file of a fixed name: one folder per rank.
  const fs::path scratch = rank == 0 ? root : root / (".rank-" + std::to_string(rank));
  r.failed.guard([&] {
    if (rank == 0) fs::create_directories(iter);
    if (rank != 0) fs::create_directories(scratch);
  });
  r.failed.settle();
  const auto& files = p.plan.plan.files;
  const std::vector<char> mine = files_of_rank(p.plan.plan, rank, ranks);

  std::map<std::string, size_t> index;
  for (size_t k = 0; k < p.plan.plan.entries.size(); ++k) index[p.plan.plan.entries[k].fqn] = k;
  uint64_t read = 0;
  // One parameter state in memory: the chunks of a key come layer by layer, TP piece by TP piece.
  struct Cached {
    size_t param = SIZE_MAX;
    std::string state;
    DType dtype = DType::Float32;
    Tensor t;
  } cache;
  auto param_state = [&](size_t param, const std::string& state, DType dtype) -> const Tensor& {
    if (cache.param == param && cache.state == state && cache.dtype == dtype) return cache.t;
    cache = {};  // the previous state goes before the next is made: memory holds one at a time
    Tensor t = p.in.streamed_value(param, state, options.verify, read);
    if (dtype != DType::Float32 && t.storage() && t.storage()->is_generated()) {
      t = generated_cast(t, dtype);  // made window by window as it is written
    } else if (dtype != DType::Float32) {
      const auto b = t.contiguous_bytes();
      std::vector<uint8_t> out(static_cast<size_t>(t.numel()) * dtype_size(dtype));
      convert_from_fp32(reinterpret_cast<const float*>(b.data()), static_cast<size_t>(t.numel()), dtype, out.data());
      t = Tensor::from_bytes(dtype, t.shape(), std::move(out));
    }
    cache = {param, state, dtype, std::move(t)};
    return cache.t;
  };
  // Progress by chunk written (a long import or export showed nothing between its start and its end).
  uint64_t chunks = 0;  // this rank's (rank 0 shows them)
  for (size_t f = 0; f < files.size(); ++f)
    for (const auto& it : files[f].items) chunks += mine[f] && !p.plan.plan.entries[it.entry].is_bytes ? 1 : 0;
  Reporter::Bar progress(options.reporter, "ucp-load", chunks, rank == 0);
  formats::dcp::ChunkSource source;
  source.chunk = [&](const formats::dcp::Entry& e, size_t chunk) -> Tensor {
    check_interrupted();
    progress.advance();
    const size_t entry = index.at(e.fqn);
    const EntrySource& s = p.plan.sources[entry];
    const auto origin = formats::megatron_core::chunk_origin(p.plan, entry, chunk);
    const Tensor& whole = s.kind == EntrySource::Model
                              ? param_state(origin.param, "fp32", p.layout.model_dtype)
                              : param_state(origin.param, formats::megatron_core::universal_state_name(s.state), DType::Float32);
    return formats::dcp::cut_box(whole, origin.box).reshape(e.chunks[chunk].sizes);
  };
  ValuePtr objects = p.in.objects;
  if (!p.in.extra_keys.empty()) {  // forward: the ._extra_state objects as ucp-union --to-names megatron-core makes them
    std::vector<std::string> names;
    for (const auto& e : p.in.manifest.params) names.push_back(e.name);
    objects = formats::megatron_core::extra_state_objects(names, formats::megatron_core::args_facts(p.in.common, p.in.dir).homogeneous,
                                                          scratch.string());
  }
  source.bytes = [&](const formats::dcp::Entry& e) -> std::vector<uint8_t> {
    if (e.fqn == kCommonStateItem) return torch_save_bytes(Value::list(std::vector<ValuePtr>{p.common}), scratch);
    const auto v = objects ? objects->get(e.fqn) : nullptr;
    if (!v || !v->is(Kind::Bytes)) throw Error(p.in.dir + "/" + kMegatronCoreObjectsFile + ": " + e.fqn + " is not bytes");
    return std::vector<uint8_t>(v->s.begin(), v->s.end());
  };
  formats::dcp::WriteOptions wo;
  wo.durable = false;  // the staging folder is flushed at its commit
  // StorageMeta.checkpoint_id: the final iteration folder (Megatron's save passes it), not the staging one.
  wo.checkpoint_id = (fs::absolute(options.output).lexically_normal() / iteration_folder(p)).string();
  formats::dcp::WriteResult result;
  r.failed.guard([&] {
    result = formats::dcp::write_dcp_files(p.plan.plan, source, iter.string(), mine, iter.string());
    progress.finish();
    if (rank != 0) fs::remove_all(scratch);
  });
  r.failed.settle();
  r.read += read;
  r.written += result.bytes;
  r.files += static_cast<size_t>(std::count(mine.begin(), mine.end(), 1));
  r.failed.guard([&] { gather_items(result, r.mpi); });  // collective: every rank got here
  r.failed.guard([&] {
    if (rank == 0) write_save_files(p, result, wo, root, iter, r);
  });
}

class TorchDistOutput final : public OutputWriter {
 public:
  bool takes_model_map() const override { return true; }
  bool takes_megatron_options() const override { return true; }
  bool reads_model() const override { return false; }
  bool reads_megatron_core_input() const override { return true; }
  bool staging_notes_warn() const override { return true; }

  void prepare(const LoadOptions& options, Prepared& p) const override {
    auto td = std::make_shared<TdPrepared>(prepare_torch_dist(options));
    p.from_source = td->from_source;
    p.output = std::move(td);
  }

  // tp, pp, ep and dtype taken from the source are said by the tool (describe_source_defaults); DP here.
  void announce(const LoadOptions& options, const Prepared& prep) const override {
    const TdPrepared& p = of(prep);
    if (p.from_source.contains("dp"))
      options.reporter.warning("--dp not given: DP " + p.from_source["dp"].dump() + " as the source's (torch_dist)");
  }

  nlohmann::json plan_json(const LoadOptions&, const Prepared& p) const override { return plan_of(of(p)); }

  void write(LoadRun& r, const std::string& staged) const override {
    write_torch_dist(r.options, of(r.prep), staged, r);  // settled step by step (collective under mpirun)
  }

  void summarize(const LoadRun& r, LoadSummary& s) const override {
    const TdPrepared& p = of(r.prep);
    s.params = p.in.manifest.params.size();
    s.target = p.target;
    s.threads = 1;  // formats/dcp/writer writes with one thread
  }

 private:
  static const TdPrepared& of(const Prepared& p) { return static_cast<const TdPrepared&>(*p.output); }
};

[[maybe_unused]] const bool kTorchDistOutputRegistered =
    register_output_writer(OutputFormat::TorchDist, std::make_shared<TorchDistOutput>());

}  // namespace

}  // namespace ucpkit::reshard
