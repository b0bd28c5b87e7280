// ucp-load --format torch_dist / hf of a Hugging Face folder in one pass (megatron_core_input.h): the folder read
// as the Megatron-Core-named universal folder its import would be (to_universal/from_hf.h hf_megatron_core: the
// manifest, the common state with Megatron args from config.json and a fresh run's optimizer), each parameter
// state made when the writer asks for it: fp32 the safetensors weights upcast and joined (QKV per query group,
// SwiGLU's [W; V], one expert of a fused tensor), exp_avg and exp_avg_sq zeros. Nothing is written in between:
// through a universal folder the import wrote three fp32 states per parameter and read them back, about 24 bytes
// per weight of a bf16 model against the 16 the input and the output hold (docs/notes/hf-bridge.md).
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "formats/detect.h"
#include "formats/hf/folder.h"
#include "formats/megatron_core/deepspeed_common_state.h"
#include "io/dtype.h"
#include "io/shape.h"
#include "reshard/megatron_core_input.h"
#include "to_universal/direct.h"  // from_hf.h

namespace ucpkit::reshard {

namespace {

// The folder, its plan and the last fp32 value made: a torch_dist output asks for a parameter's weights twice in a
// row (the model tensor in the model dtype, then the fp32 master), a join is made once for both.
struct HfStates {
  formats::hf::Folder folder;
  formats::hf::ImportPlan plan;
  std::mutex mu;
  size_t last = std::numeric_limits<size_t>::max();
  Tensor last_value;

  explicit HfStates(const std::string& dir) : folder(dir), plan(to_universal::hf_import_plan(folder)) {}

  Tensor state(size_t param, const std::string& s, uint64_t& read) {
    if (s != "fp32") return to_universal::hf_fresh_state(folder, plan, param, s);
    std::lock_guard<std::mutex> lock(mu);
    if (last != param) {
      last_value = to_universal::hf_fresh_state(folder, plan, param, s);
      last = param;
      for (const auto& name : plan.params.at(param).sources) {
        const auto& t = folder.tensors().at(name);
        read += static_cast<uint64_t>(numel_of(t.shape)) * dtype_size(t.dtype);
      }
    }
    return last_value;
  }

  // The same, made as it is written (to_universal/hf_joined_stream.h): nothing whole, only the rows asked for read.
  Tensor stream(size_t param, const std::string& s, uint64_t& read) {
    if (s != "fp32") return to_universal::hf_fresh_state(folder, plan, param, s);
    const auto& p = plan.params.at(param);
    Tensor t = to_universal::hf_joined_stream(folder, plan, p);
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& name : p.sources) {  // counted once per parameter, as state() counts its join
      if (streamed.insert(name).second) {
        const auto& x = folder.tensors().at(name);
        read += static_cast<uint64_t>(numel_of(x.shape)) * dtype_size(x.dtype);
      }
    }
    return t;
  }
  std::set<std::string> streamed;  // sources counted in `read`
};

MegatronCoreInput open_hf(const LoadOptions& o, std::string_view) {
  auto hf = std::make_shared<HfStates>(o.input);
  to_universal::HfMegatronCore core = to_universal::hf_megatron_core(hf->folder, hf->plan, o.input);
  MegatronCoreInput p;
  p.dir = o.input;
  p.manifest_path = o.input + " (its Megatron-Core parameters, planned from the family map)";
  p.common_path = o.input + "/config.json (the Megatron-Core common state made from it)";
  p.manifest = std::move(core.manifest);
  p.common = core.common;
  p.extra_keys = formats::megatron_core::extra_state_keys(core.names, core.stacked);
  p.family = hf->plan.family + " (" + hf->plan.origin + ")";
  p.states = [hf](size_t param, const std::string& state, uint64_t& read) { return hf->state(param, state, read); };
  p.streams = [hf](size_t param, const std::string& state, bool, uint64_t& read) { return hf->stream(param, state, read); };
  o.reporter.warning(o.input + ": Hugging Face family " + p.family + ", " + std::to_string(hf->plan.params.size()) +
                     " Megatron-Core parameters, read in one pass; optimizer state initialised as a fresh run's "
                     "(exp_avg = exp_avg_sq = 0, step 0)");
  return p;
}

[[maybe_unused]] const bool kHfReaderRegistered = register_megatron_core_reader(formats::kHf, {open_hf, to_universal::write_hf_import_audit});

}  // namespace

}  // namespace ucpkit::reshard
