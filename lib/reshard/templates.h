// The source files every DeepSpeed target file of a ucp-load run starts from, parsed once per run
// and shared by every writer of the run (run_load's, `--plan`'s, every thread): the template
// model-states roots (ModelInfo::model_files), each parsed on first use and never changed (callers
// copy before they change anything), and the native-MoE version line the target writes, decided
// from the first template. Before, each writer parsed its own copies (one traced run opened a
// template 12 times).
#pragma once
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "formats/deepspeed/version_line.h"
#include "io/pickle/value.h"
#include "io/torch/torch_file.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"

namespace ucpkit::reshard {

class Templates {
 public:
  // `paths`: ModelInfo::model_files (copied: the templates outlive moves of the ModelInfo).
  // `open`: how each file is opened (its CRC check, torch_file.h).
  explicit Templates(std::vector<std::string> paths, const TorchLoadOptions& open = {});
  // Template model file `file` (index into the paths), parsed on first use; thread-safe.
  const pickle::ValuePtr& model_states(int file) const;
  const std::vector<std::string>& paths() const { return paths_; }
  // How many templates have been parsed so far (each once).
  size_t parsed() const;

 private:
  std::vector<std::string> paths_;
  TorchLoadOptions open_;
  mutable std::mutex mu_;
  mutable std::vector<pickle::ValuePtr> roots_;
};

// Native MoE: the DeepSpeed version line `target` writes (its ds_line, else the source's, read from
// the first template); nullptr for other models.
const formats::deepspeed::VersionLine* target_moe_line(const ModelInfo& model, const TargetLayout& target,
                                                       const Templates& templates);

}  // namespace ucpkit::reshard
