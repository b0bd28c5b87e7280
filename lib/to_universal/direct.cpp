// ucp-load's direct mode's view of the extract side (direct.h): forwards only.
#include "to_universal/direct.h"

#include "core/mapped_file.h"
#include "io/torch/torch_file.h"
#include "to_universal/extract.h"
#include "to_universal/save.h"
#include "to_universal/shard_reader.h"
#include "to_universal/union_fragments.h"

namespace ucpkit::to_universal {

ExtractPlan plan_native_checkpoint(const std::string& checkpoint, const TorchLoadOptions& open) {
  ExtractOptions options;
  options.open = open;
  return plan_checkpoint(checkpoint, options);
}

ExtractPlan plan_of_work_folder(const std::string& work_dir) { return load_work_plan(work_dir); }

pickle::ValuePtr universal_optimizer_state(const pickle::ValuePtr& optimizer_shard_root, const std::string& path) {
  return common_optimizer_state(optimizer_shard_root, path);
}

Tensor strip_vocab_padding(const std::string& name, const Tensor& t, int64_t original_vocab_size) {
  return strip_padding(name, t, original_vocab_size);
}

FragmentReader::FragmentReader(const std::vector<std::string>& files, const TorchLoadOptions& open)
    : cache_(std::make_unique<SourceCache>(files, open)) {}
FragmentReader::~FragmentReader() = default;

Tensor FragmentReader::fragment(const SourceFragment& f, const std::string& state) {
  return fragment_tensor(*cache_, f, state);
}

Tensor FragmentReader::slice(const std::vector<SourceFragment>& fragments, const std::string& state,
                             const std::vector<int64_t>& shape, uint64_t* bytes_read) {
  return read_slice(*cache_, fragments, state, shape, bytes_read);
}

pickle::ValuePtr FragmentReader::step(int file, int group) { return read_step(*cache_, file, group); }

const std::string& FragmentReader::path(int file) const { return cache_->path(file); }

bool FragmentReader::read_into(int file, const Tensor& t, uint8_t* dst) { return cache_->read_into(file, t, dst); }

uint64_t FragmentReader::file_offset(int file, const Tensor& t) {
  const auto tf = cache_->get(file);
  if (!tf->file || !t.storage() || !t.storage()->is_mapped()) return 0;
  return static_cast<uint64_t>(t.contiguous_bytes().data() - tf->file->data());
}

}  // namespace ucpkit::to_universal
