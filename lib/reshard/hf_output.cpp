// ucp-load --format hf: a Hugging Face model folder as transformers' save_pretrained writes it
// (docs/hf.md): config.json, the weights in Hugging Face names and layouts as safetensors
// (model.safetensors, or model-0000k-of-0000n.safetensors plus model.safetensors.index.json). The input
// is read in Megatron-Core names (megatron_core_input.h: a DeepSpeed / Megatron-DeepSpeed checkpoint or
// its universal folder, a torch_dist save, a Megatron-Core-named universal folder); the model's
// family, config and tensor layout come from the args of its common state and a family map
// (formats/hf). Weights only: the optimizer state has no place in a Hugging Face folder. One process.
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/sha256.h"
#include "core/staging.h"
#include "formats/detect.h"
#include "formats/hf/export_plan.h"
#include "formats/hf/import_plan.h"
#include "formats/megatron_core/deepspeed_map.h"
#include "formats/megatron_core/model_facts.h"
#include "io/generated_view.h"
#include "io/safetensors_file.h"
#include "reshard/direct_source.h"
#include "reshard/megatron_core_input.h"
#include "reshard/output_writer.h"
#include "reshard/safetensors_writer.h"
#include "reshard/target_defaults.h"
#include "reshard/universal_reader.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

namespace {

struct HfPrepared : WriterPlan {
  MegatronCoreInput in;
  formats::hf::ExportPlan plan;
  // A DeepSpeed checkpoint already in Hugging Face names (is_transformers_named_checkpoint): read as a model (Prepared::model
  // and its direct source), each tensor written as it is named; `plan` holds those tensors (no split) and the
  // source's config.json.
  bool hf_named = false;
  nlohmann::json from_source = nlohmann::json::object();
  // --audit: one record per tensor, filled as it is written (one process), written after the commit.
  mutable nlohmann::json audit = nlohmann::json::array();
};

// The audit record of `piece` whose bytes are `bytes` (docs/hf.md "Audit").
nlohmann::json audit_record(const HfPrepared& p, const formats::hf::Piece& piece, const std::string& sha256) {
  const auto& e = p.in.manifest.params.at(piece.param);
  const std::string source_dtype = e.dtype ? *e.dtype : std::string("float32");
  nlohmann::json transform = nlohmann::json::array();
  const int64_t rows = e.shape.empty() ? 1 : e.shape[0];
  nlohmann::json from = nlohmann::json::array();
  for (size_t i : piece.params())
    from.push_back({{"name", p.in.manifest.params.at(i).name}, {"state", "fp32"}, {"model_dtype", source_dtype}});
  if (!piece.stack.empty())
    transform.push_back("stack " + std::to_string(piece.stack.size()) + " experts on a new first axis");
  else if (piece.split == formats::hf::Split::Qkv)
    transform.push_back("qkv: per query group [q..., k, v] regrouped to [Q; K; V], rows [" + std::to_string(piece.row0) + ", " +
                        std::to_string(piece.row0 + piece.rows) + ")");
  else if (piece.rows != rows)
    transform.push_back("rows [" + std::to_string(piece.row0) + ", " + std::to_string(piece.row0 + piece.rows) + ") of " +
                        std::to_string(rows));
  if (p.plan.dtype != DType::Float32)
    transform.push_back("cast float32 -> " + std::string(dtype_name(p.plan.dtype)) + " (round to nearest even)");
  return {{"name", piece.name}, {"dtype", std::string(dtype_name(p.plan.dtype))}, {"shape", piece.shape},
          {"sha256", sha256}, {"from", from}, {"transform", transform}};
}

// Experts written per MoE layer, from the Megatron-Core names of the pieces: a dropped expert shows.
nlohmann::json experts_per_layer(const HfPrepared& p) {
  std::vector<std::string> names;
  for (const auto& piece : p.plan.tensors)
    for (size_t i : piece.params()) names.push_back(p.in.manifest.params.at(i).name);
  return formats::hf::experts_per_layer(names);
}

// The audit document: the records, totals, dtype changes (the source's model dtype -> the written one).
nlohmann::json audit_document(const LoadOptions& o, const HfPrepared& p) {
  int64_t values = 0;
  std::map<std::string, int64_t> changes;
  for (const auto& r : p.audit) {
    int64_t n = 1;
    for (const auto& d : r["shape"]) n *= d.get<int64_t>();
    values += n;
    const std::string from = r["from"][0]["model_dtype"], to = r["dtype"];
    if (from != to) ++changes[from + " -> " + to];
  }
  return {{"format", "ucpkit-audit"}, {"version", 1}, {"conversion", "ucp-load --format hf"}, {"input", o.input},
          {"output", o.output}, {"family", p.plan.family}, {"map", p.plan.origin},
          {"totals", {{"tensors", p.audit.size()}, {"values", values}, {"bytes", p.plan.bytes()}}},
          {"dtype_changes", changes}, {"experts_per_layer", experts_per_layer(p)}, {"tensors", p.audit}};
}

HfPrepared prepare_hf(const LoadOptions& o) {
  HfPrepared p;
  p.in = open_megatron_core_input(o, "hf");
  const nlohmann::json facts = formats::megatron_core::model_facts(p.in.common, p.in.common_path);
  formats::hf::ExportInput ei;
  for (size_t i = 0; i < p.in.manifest.params.size(); ++i) {
    const auto& e = p.in.manifest.params[i];
    ei.names.push_back(e.name);
    ei.shapes.push_back(e.shape);
    // The vocabulary as the source holds it: a DeepSpeed source's rows (not the zero rows the
    // Megatron-Core view pads them with), a Megatron-Core source's padded rows (all of them trained).
    if (e.name == "embedding.word_embeddings.weight" && !e.shape.empty()) ei.vocab = e.shape[0] - p.in.rows_added(i);
  }
  DType dtype = DType::Float32;
  if (o.given.dtype) {
    dtype = o.target.dtype;
  } else if (const auto d = p.in.model_dtype()) {
    dtype = *d;
    p.from_source["dtype"] = dtype_option_name(dtype);
  } else {
    throw UsageError(p.in.manifest_path + " does not record the model dtype: give --dtype");
  }
  std::vector<formats::hf::Family> families = formats::hf::shipped_hf_families();
  p.plan = formats::hf::plan_hf_export(families, facts, ei, dtype, o.shard_bytes, o.input, o.fused_experts);
  return p;
}

// A DeepSpeed checkpoint of a transformers model (direct_source.h is_transformers_named_checkpoint: its module
// names are the Hugging Face names, the model's config.json beside it), its plan: the family map (plan_hf_import)
// checks that its tensor names and shapes are the model config.json states, every tensor used once; the tensors
// are written as they are, in the output dtype, and config.json is the source's with that dtype.
HfPrepared prepare_hf_named(const LoadOptions& o, const Prepared& prep) {
  if (!o.audit.empty())
    throw UsageError("--audit: no audit is recorded for " + o.input + ", a checkpoint already in Hugging Face names (its "
                     "tensors are written as they are)");
  if (o.fused_experts)
    throw UsageError("--hf-experts: " + o.input + " is already in Hugging Face names; its experts are written in its own layout");
  const std::string config_path = (fs::path(o.input) / "config.json").string();
  const std::string config_text = read_text_file(config_path, "config.json");
  nlohmann::ordered_json config;  // written back in its own key order
  try {
    config = nlohmann::ordered_json::parse(config_text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(config_path + ": not JSON (" + e.what() + ")");
  }
  HfPrepared p;
  p.hf_named = true;
  const ModelInfo& m = prep.model;
  const DType dtype = prep.plan.target.dtype;
  std::map<std::string, formats::hf::TensorShape> tensors;
  const auto shards = safetensors_shards(m, dtype, o.shard_bytes);
  for (const auto& shard : shards)
    for (int i : shard) {
      formats::hf::Piece piece;
      piece.name = safetensors_name(m, i);
      piece.shape = safetensors_shape(m, i);
      tensors[piece.name] = {safetensors_dtype(m, i, dtype), piece.shape};
      piece.param = static_cast<size_t>(i);
      p.plan.tensors.push_back(std::move(piece));
    }
  formats::hf::ImportPlan ip;
  try {
    ip = formats::hf::plan_hf_import(formats::hf::shipped_hf_families(), nlohmann::json::parse(config_text), tensors, o.input);
  } catch (const Error& e) {  // say why the names were taken for Hugging Face names
    throw Error(std::string(e.what()) + " (a checkpoint with a config.json is written in its own names, which must be the "
                "Hugging Face names of the model config.json states)");
  }
  p.plan.family = ip.family;
  p.plan.origin = ip.origin;
  p.plan.dtype = dtype;
  p.plan.vocab = ip.facts["vocab"].get<int64_t>();
  for (size_t k = 0, t = 0; k < shards.size(); ++k) {
    p.plan.shards.emplace_back();
    for (size_t j = 0; j < shards[k].size(); ++j) p.plan.shards.back().push_back(t++);
    p.plan.files.push_back(safetensors_shard_file(k, shards.size()));
  }
  config.erase("torch_dtype");  // transformers 4's name of the key transformers 5 writes as dtype
  config["dtype"] = std::string(dtype_name(dtype));  // torch's name: float32, bfloat16, float16
  p.plan.config = config;
  return p;
}

// The whole value of one Megatron-Core parameter, kept while its pieces are written (a QKV or fc1
// split writes several tensors from it), in the target dtype, QKV regrouped to [Q; K; V].
class ValueCache {
 public:
  ValueCache(const HfPrepared& p, bool verify) : p_(p), verify_(verify) {}
  const Tensor& get(const formats::hf::Piece& t) {
    if (param_ == t.param && split_ == t.split) return value_;
    Tensor v = p_.in.streamed_value(t.param, "fp32", verify_, read_);
    if (v.storage() && v.storage()->is_generated()) {  // made as it is written: nothing whole (generated_view.h)
      if (t.split == formats::hf::Split::Qkv) {
        std::vector<int64_t> order;
        for (const auto& run : formats::megatron_core::qkv_grouped_to_split_rows(
                 v.shape().size(), v.shape().empty() ? 0 : v.shape()[0], {p_.plan.heads, p_.plan.kv_heads, p_.plan.head_dim}))
          for (int64_t r = 0; r < run.rows; ++r) order.push_back(run.in + r);
        v = generated_rows(v, std::move(order));
      }
      value_ = generated_cast(v, p_.plan.dtype);
      param_ = t.param, split_ = t.split;
      return value_;
    }
    if (t.split == formats::hf::Split::Qkv)
      v = formats::megatron_core::qkv_grouped_to_split(v, {p_.plan.heads, p_.plan.kv_heads, p_.plan.head_dim});
    v = v.contiguous();
    if (p_.plan.dtype != DType::Float32) {  // rounded as every other writer rounds (convert_from_fp32)
      const auto b = v.contiguous_bytes();
      std::vector<uint8_t> out(static_cast<size_t>(v.numel()) * dtype_size(p_.plan.dtype));
      convert_from_fp32(reinterpret_cast<const float*>(b.data()), static_cast<size_t>(v.numel()), p_.plan.dtype, out.data());
      v = Tensor::from_bytes(p_.plan.dtype, v.shape(), std::move(out));
    }
    value_ = std::move(v);
    param_ = t.param, split_ = t.split;
    return value_;
  }
  uint64_t read() const { return read_; }

 private:
  const HfPrepared& p_;
  bool verify_;
  size_t param_ = SIZE_MAX;
  formats::hf::Split split_ = formats::hf::Split::None;
  Tensor value_;
  uint64_t read_ = 0;
};

// Writes the folder into `staged`; returns the bytes written.
uint64_t write_hf(const LoadOptions& o, const HfPrepared& p, const std::string& staged, LoadRun& r) {
  const auto& plan = p.plan;
  const std::string st_dtype(dtype_safetensors_name(plan.dtype));
  const size_t es = dtype_size(plan.dtype);
  ValueCache cache(p, o.verify);
  uint64_t written = 0;
  Reporter::Bar progress(o.reporter, "ucp-load", plan.tensors.size());  // by Hugging Face tensor written
  for (size_t k = 0; k < plan.shards.size(); ++k) {
    std::vector<SafetensorsEntry> entries;
    for (size_t t : plan.shards[k]) {
      const auto& piece = plan.tensors[t];
      int64_t n = 1;
      for (auto d : piece.shape) n *= d;
      entries.push_back({piece.name, st_dtype, piece.shape, static_cast<uint64_t>(n) * es});
    }
    const std::string header = safetensors_header(entries, {{"format", "pt"}});
    AtomicFile f((fs::path(staged) / plan.files[k]).string());
    f.write(header.data(), header.size());
    for (size_t j = 0; j < entries.size(); ++j) {
      const auto& piece = plan.tensors[plan.shards[k][j]];
      Sha256 sha;
      // A stacked (fused experts) tensor is its experts' values one after another, each whole.
      for (size_t i : piece.params()) {
        check_interrupted();
        formats::hf::Piece part = piece;
        part.param = i;
        const Tensor& v = cache.get(part);
        if (v.storage() && v.storage()->is_generated()) {  // its rows made window by window
          const uint64_t row_bytes = v.shape().empty() || v.shape()[0] == 0 ? 0 : v.nbytes() / static_cast<uint64_t>(v.shape()[0]);
          const uint64_t end = static_cast<uint64_t>(piece.row0 + piece.rows) * row_bytes;
          thread_local std::vector<uint8_t> window;
          const uint64_t step = std::max<uint64_t>(es, (uint64_t{8} << 20) / es * es);
          for (uint64_t at = static_cast<uint64_t>(piece.row0) * row_bytes; at < end; at += step) {
            window.resize(static_cast<size_t>(std::min(step, end - at)));
            v.storage()->generate(at, window);
            f.write(window.data(), window.size());
            if (!o.audit.empty()) sha.update(window);
          }
          continue;
        }
        const auto bytes = v.contiguous_bytes();
        const size_t row_bytes = v.shape().empty() || v.shape()[0] == 0 ? 0 : bytes.size() / static_cast<size_t>(v.shape()[0]);
        const std::span<const uint8_t> out(bytes.data() + static_cast<size_t>(piece.row0) * row_bytes,
                                           static_cast<size_t>(piece.rows) * row_bytes);
        f.write(out.data(), out.size());
        if (!o.audit.empty()) sha.update(out);
      }
      if (!o.audit.empty()) p.audit.push_back(audit_record(p, piece, sha.hex()));
      progress.advance();
    }
    written += f.offset();
    f.commit();
  }
  if (plan.shards.size() > 1) {  // save_pretrained writes the index only for a sharded model
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", plan.bytes()}};
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    for (size_t k = 0; k < plan.shards.size(); ++k)
      for (size_t t : plan.shards[k]) map[plan.tensors[t].name] = plan.files[k];
    index["weight_map"] = map;
    const std::string text = index.dump(2) + "\n";
    write_file_atomic((fs::path(staged) / "model.safetensors.index.json").string(), text);
    written += text.size();
    r.files += 1;
  }
  progress.finish();
  const std::string config = plan.config.dump(2) + "\n";
  write_file_atomic((fs::path(staged) / "config.json").string(), config);
  written += config.size();
  r.files += plan.shards.size() + 1;
  r.read += cache.read();
  return written;
}

class HfOutput final : public OutputWriter {
 public:
  bool reads_model() const override { return false; }
  bool reads_model_of(const LoadOptions& o) const override { return is_transformers_named_checkpoint(o.input); }
  bool reads_megatron_core_input() const override { return true; }
  bool takes_model_map() const override { return true; }
  bool takes_audit() const override { return true; }
  bool takes_experts_layout() const override { return true; }
  bool takes_layout_options() const override { return false; }
  std::string why_no_layout() const override { return " (one set of unsharded weights)"; }
  bool takes_world_size() const override { return false; }
  bool one_process() const override { return true; }

  void prepare(const LoadOptions& options, Prepared& p) const override {
    if (is_transformers_named_checkpoint(options.input)) {  // read as a model by run_load (reads_model_of): its from_source kept
      p.output = std::make_shared<HfPrepared>(prepare_hf_named(options, p));
      return;
    }
    auto hp = std::make_shared<HfPrepared>(prepare_hf(options));
    p.from_source = hp->from_source;
    p.output = std::move(hp);
  }

  void announce(const LoadOptions& options, const Prepared& prep) const override {
    const HfPrepared& p = of(prep);
    options.reporter.warning("Hugging Face family " + p.plan.family + " (" + p.plan.origin + "): " +
                             std::to_string(p.plan.tensors.size()) + " tensors, vocabulary " + std::to_string(p.plan.vocab) +
                             " rows; weights only (the optimizer state has no place in a Hugging Face folder)");
  }

  nlohmann::json plan_json(const LoadOptions&, const Prepared& prep) const override {
    const HfPrepared& p = of(prep);
    nlohmann::json j = p.plan.to_json();
    j["format"] = "hf";
    j["from_source"] = p.hf_named ? prep.from_source : p.from_source;  // a checkpoint read as a model: run_load's
    return j;
  }

  void write(LoadRun& r, const std::string& staged) const override {
    const HfPrepared& p = of(r.prep);
    if (p.hf_named) {
      r.failed.guard([&] {
        r.written += write_safetensors(r.prep.model, r.reader, p.plan.dtype, r.options.shard_bytes, staged, r.threads);
        const std::string config = p.plan.config.dump(2) + "\n";
        write_file_atomic((fs::path(staged) / "config.json").string(), config);
        r.written += config.size();
        r.files += p.plan.shards.size() + 2;  // the shards, the index, config.json
      });
      return;
    }
    r.failed.guard([&] { r.written += write_hf(r.options, p, staged, r); });
  }

  void summarize(const LoadRun& r, LoadSummary& s) const override {
    const HfPrepared& p = of(r.prep);
    s.params = p.hf_named ? r.prep.model.params.size() : p.in.manifest.params.size();
    s.target = {{"family", p.plan.family}, {"architectures", p.plan.config["architectures"]},
                {"dtype", dtype_option_name(p.plan.dtype)}, {"vocab_size", p.plan.vocab}, {"tensors", p.plan.tensors.size()}};
    s.threads = 1;
    if (!r.options.audit.empty()) {  // the output is in place: its audit beside it
      write_file_atomic(r.options.audit, audit_document(r.options, p).dump(1) + "\n");
      s.target["audit"] = r.options.audit;
    }
  }

 private:
  static const HfPrepared& of(const Prepared& p) { return static_cast<const HfPrepared&>(*p.output); }
};

[[maybe_unused]] const bool kHfOutputRegistered = register_output_writer(OutputFormat::Hf, std::make_shared<HfOutput>());

}  // namespace

}  // namespace ucpkit::reshard
