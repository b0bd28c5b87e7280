// ucp-load --format hf / torch_dist of a Megatron-Core torch_dist save in one pass (megatron_core_input.h): the save
// read as the universal folder ucp-union would write of it (to_universal/from_torch_dist.h: the same manifest, the
// common state in its fully_reshardable form, the ._extra_state objects as stored), each parameter state read whole
// from the save when the writer asks for it (TorchDistStates::read, its items' CRC-32s checked). An export to Hugging
// Face reads only the fp32 states it writes from; through a universal folder every state was written and read back.
#include "formats/detect.h"
#include "reshard/megatron_core_input.h"
#include "to_universal/direct.h"  // from_torch_dist.h

namespace ucpkit::reshard {

namespace {

MegatronCoreInput open_torch_dist(const LoadOptions& o, std::string_view) {
  auto td = std::make_shared<const to_universal::TorchDistStates>(o.input);
  MegatronCoreInput p;
  p.dir = o.input;
  p.manifest_path = o.input + " (its parameters as ucp-union would list them)";
  p.common_path = o.input + " (its common state)";
  p.manifest = to_universal::torch_dist_manifest(*td);
  p.common = td->common();
  p.objects = to_universal::stored_extra_state_objects(td->checkpoint());
  p.states = [td](size_t param, const std::string& state, uint64_t& read) {
    Tensor t = td->read(param, state);
    read += t.nbytes();
    return t;
  };
  o.reporter.detail(o.input + ": Megatron-Core torch_dist save, " + std::to_string(p.manifest.params.size()) +
                    " parameters, read in one pass");
  return p;
}

[[maybe_unused]] const bool kTorchDistReaderRegistered = register_megatron_core_reader(formats::kTorchDist, {open_torch_dist, {}});

}  // namespace

}  // namespace ucpkit::reshard
