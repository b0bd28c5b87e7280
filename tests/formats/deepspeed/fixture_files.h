// The formats/deepspeed tests' view of tests/formats/fixtures.py's checkpoints (DeepSpeed's files as
// dsgen and torch.save write them) and the one byte comparison they share: two value trees saved by
// our torch writer, so a difference is a difference of keys, order, kinds or sharing.
#pragma once
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "io/pickle/value.h"
#include "io/torch/torch_file.h"
#include "support/files.h"
#include "support/process.h"

namespace ucpkit::testing::fixtures {

inline const std::string& dir() {
  static const std::string d = UCPKIT_FIXTURES_DIR;
  return d;
}

// The step folder `latest` names (dsgen writes global_step100, its AutoEP generator global_step7).
inline std::filesystem::path step_dir(const std::string& checkpoint) {
  std::string tag = file_bytes((std::filesystem::path(dir()) / checkpoint / "latest").string());
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
  return std::filesystem::path(dir()) / checkpoint / tag;
}

// The step folder's files whose name contains `part`, sorted by name.
inline std::vector<std::string> files_with(const std::string& checkpoint, const std::string& part) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(step_dir(checkpoint)))
    if (e.path().filename().string().find(part) != std::string::npos) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Where two byte strings first differ, for a short failure message ("" when equal).
inline std::string first_difference(const std::string& got, const std::string& want) {
  if (got == want) return "";
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return "differ at byte " + std::to_string(i) + " of " + std::to_string(want.size()) + ": got ..." +
         got.substr(i > 40 ? i - 40 : 0, 120) + "\nwant ..." + want.substr(i > 40 ? i - 40 : 0, 120);
}

// `name` in this test process's scratch folder.
inline std::string scratch_path(const std::string& name) {
  static const std::string scratch = scratch_dir("formats_deepspeed");
  return (std::filesystem::path(scratch) / name).string();
}

// Bytes our torch writer gives for `root` (pickle and storage records), saved as `name` in this
// test process's scratch folder.
inline std::string saved(const pickle::ValuePtr& root, const std::string& name) {
  const std::string path = scratch_path(name);
  save_torch_file(path, root);
  return file_bytes(path);
}

}  // namespace ucpkit::testing::fixtures
