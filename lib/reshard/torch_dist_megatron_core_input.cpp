// ucp-load --format hf / torch_dist of a Megatron-Core torch_dist save in one pass (megatron_core_input.h): the save
// read as the universal folder ucp-union would write of it (to_universal/from_torch_dist.h: the same manifest, the
// common state in its fully_reshardable form, the ._extra_state objects as stored), each parameter state read whole
// from the save when the writer asks for it (TorchDistStates::read, its items' CRC-32s checked), or made as it is
// written, range by range, for a writer that streams. An export to Hugging Face reads only the fp32 states it writes from; through
// a universal folder every state was written and read back.
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>

#include "formats/dcp/range_reader.h"
#include "formats/detect.h"
#include "io/tensor.h"
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
  // Streamed: each fp32 state a generated tensor copying element ranges out of the data files as they are written
  // (formats/dcp/range_reader.h); whole where its chunks do not suit a range reader. With --verify its items' CRC-32s
  // are checked first, once per state and run, where they lie in the mapped data files (RangeReader::check_now: the
  // writers may ask for a range twice, which a range reader's check while copying does not allow).
  struct Checked {  // the states whose items were checked (a torch_dist output asks for the fp32 state twice)
    std::mutex mu;
    std::set<std::pair<size_t, std::string>> done;
  };
  auto checked = std::make_shared<Checked>();
  p.streams = [td, checked](size_t param, const std::string& state, bool verify, uint64_t& read) {
    std::shared_ptr<formats::dcp::RangeReader> r = td->range(param, state);
    if (!r) {
      Tensor t = td->read(param, state);
      read += t.nbytes();
      return t;
    }
    bool first = false;
    if (verify) {
      std::lock_guard<std::mutex> lock(checked->mu);
      first = checked->done.insert({param, state}).second;
    }
    if (first) r->check_now();
    else r->trust();
    read += static_cast<uint64_t>(r->numel()) * 4;
    auto fill = [td, r](uint64_t off, std::span<uint8_t> out) {
      r->copy(static_cast<int64_t>(off / 4), static_cast<int64_t>(out.size() / 4), out.data());
    };
    return Tensor(Storage::generated(DType::Float32, r->numel(), fill), 0, r->shape(), Tensor::contiguous_strides(r->shape()));
  };
  o.reporter.detail(o.input + ": Megatron-Core torch_dist save, " + std::to_string(p.manifest.params.size()) +
                    " parameters, read in one pass");
  return p;
}

[[maybe_unused]] const bool kTorchDistReaderRegistered = register_megatron_core_reader(formats::kTorchDist, {open_torch_dist, {}});

}  // namespace

}  // namespace ucpkit::reshard
