// Checkpoint folders: pointer files, global_stepN tags, input kinds.
#include "formats/deepspeed/checkpoint_dir.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/file_io.h"
#include "core/atomic_file.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::deepspeed {

namespace {
constexpr const char* kStepPrefix = "global_step";

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}
}  // namespace

std::string step_tag(int64_t step) { return kStepPrefix + std::to_string(step); }

std::optional<int64_t> step_of_tag(const std::string& tag) {
  const std::string prefix = kStepPrefix;
  if (tag.size() <= prefix.size() || tag.size() > prefix.size() + 18 || tag.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  int64_t n = 0;
  for (size_t i = prefix.size(); i < tag.size(); ++i) {
    if (tag[i] < '0' || tag[i] > '9') return std::nullopt;
    n = n * 10 + (tag[i] - '0');
  }
  return n;
}

std::string tag_of_dir(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) p = fs::absolute(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // a trailing slash
  return p.filename().string();
}

std::string read_pointer(const std::string& pointer_file) {
  // At most a folder name's worth of bytes is read: a pointer symlinked to another file (a secret, a
  // device) is neither read whole nor echoed. The message names the file and what is wrong, never
  // its content.
  constexpr size_t kMaxTag = 255;  // NAME_MAX
  const UniqueFd in = open_input(pointer_file, "tag file");  // a FIFO named latest is refused at once
  std::string raw(kMaxTag + 65, '\0');
  size_t got = 0;
  while (got < raw.size()) {
    const ssize_t n = pread_some(in.get(), raw.data() + got, raw.size() - got, got);
    if (n < 0) fail(pointer_file, std::string("read failed: ") + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  const bool longer = got > kMaxTag + 64;
  raw.resize(std::min(got, kMaxTag + 64));
  const std::string tag = trimmed(raw);
  bool ok = !longer && !tag.empty() && tag.size() <= kMaxTag && tag != "." && tag != "..";
  for (unsigned char c : tag)
    if (c < 0x20 || c == 0x7f || c == '/') ok = false;
  if (!ok) {
    std::error_code ec;
    const auto size = fs::file_size(pointer_file, ec);
    fail(pointer_file, "not a step tag (" + (ec ? std::string("unreadable size") : std::to_string(size) + " bytes") +
                           "; a tag is one folder name of at most " + std::to_string(kMaxTag) + " bytes)");
  }
  return tag;
}

TagFolder resolve_tag_folder(const std::string& path, const std::vector<std::string>& pointers) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) fail(path, "checkpoint folder not found");
  for (const auto& name : pointers) {
    const fs::path pointer = fs::path(path) / name;
    if (!fs::exists(pointer, ec) || fs::is_directory(pointer, ec)) continue;
    TagFolder t;
    t.pointer = pointer.string();
    t.tag = read_pointer(t.pointer);
    t.dir = (fs::path(path) / t.tag).string();
    if (!fs::is_directory(t.dir, ec)) {
      // A global_stepN tag is named; any other text (a pointer symlinked to another file) is not echoed.
      if (step_of_tag(t.tag)) fail(t.pointer, "names " + t.tag + ", which is not a folder");
      fail(t.pointer, "names a tag of " + std::to_string(t.tag.size()) + " bytes that is not a folder here (not a step tag)");
    }
    return t;
  }
  return {path, tag_of_dir(path), ""};
}

bool holds_shards(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 3 && n.compare(n.size() - 3, 3, ".pt") == 0 &&
        (n.find("_model_states") != std::string::npos || n.find("_optim_states") != std::string::npos))
      return true;
  }
  return false;
}

std::string resolve_checkpoint_dir(const std::string& path) { return resolve_tag_folder(path).dir; }

std::optional<int64_t> completed_step(const std::string& dir) {
  const fs::path latest = fs::path(dir) / kLatestName;
  std::error_code ec;
  if (!fs::is_regular_file(latest, ec)) return std::nullopt;
  std::string tag;
  try {
    tag = read_pointer(latest.string());
  } catch (const std::exception&) {
    return std::nullopt;  // being replaced
  }
  auto s = step_of_tag(tag);
  if (!s || !fs::is_directory(fs::path(dir) / tag, ec)) return std::nullopt;
  return s;
}

void write_latest(const std::string& dir, const std::string& tag, bool universal, bool durable) {
  write_file_atomic((fs::path(dir) / kLatestName).string(), tag, durable);
  if (universal) write_file_atomic((fs::path(dir) / kLatestUniversalName).string(), tag, durable);
}

bool looks_like_step_folder(const std::string& name) {
  return name.rfind("global_step", 0) == 0 || name.rfind(".global_step", 0) == 0;
}

}  // namespace ucpkit::formats::deepspeed
