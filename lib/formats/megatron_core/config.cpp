#include "formats/megatron_core/config.h"

#include <cctype>
#include <cstdio>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_input.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::megatron_core {

namespace {

std::string trimmed(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

std::string iteration_dir(const std::string& path) {
  if (fs::exists(fs::path(path) / kConfigFile)) return path;
  const std::string tracker = (fs::path(path) / kTrackerFile).string();
  if (!fs::exists(tracker))
    fail(path, std::string("not a Megatron-Core torch_dist checkpoint: no ") + kConfigFile + " and no " + kTrackerFile);
  const std::string it = trimmed(read_text_file(tracker));
  if (it.empty() || it.size() > 64) fail(tracker, "expected an iteration number or a folder name");
  std::string name = it;
  if (it.find_first_not_of("0123456789") == std::string::npos) {
    name = std::to_string(std::stoll(it));
    if (name.size() < 7) name.insert(0, 7 - name.size(), '0');
    name = "iter_" + name;
  } else if (it.find('/') != std::string::npos || it == "." || it == "..") {
    fail(tracker, "names a folder outside the save root: " + escaped_brief(it));
  }
  const std::string dir = (fs::path(path) / name).string();
  if (!fs::exists(fs::path(dir) / kConfigFile))
    fail(tracker, "names " + escaped_brief(name) + ", which holds no " + kConfigFile);
  return dir;
}

CheckpointConfig parse_config(const std::string& text, const std::string& name) {
  const nlohmann::json j = parse_json_input(text, name);
  if (!j.is_object()) fail(name, "expected a JSON object");
  CheckpointConfig c;
  const auto backend = j.find("sharded_backend");
  if (backend == j.end()) fail(name, "missing field sharded_backend");
  if (!backend->is_string()) fail(name, "sharded_backend must be a string, found " + json_brief(*backend));
  c.sharded_backend = backend->get<std::string>();
  if (const auto v = j.find("sharded_backend_version"); v != j.end())
    c.sharded_backend_version = json_integer(*v, name, "sharded_backend_version", 0, 1LL << 31);
  return c;
}

CheckpointConfig read_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfigFile).string();
  if (!fs::exists(path)) fail(dir, std::string("not a Megatron-Core torch_dist checkpoint: no ") + kConfigFile);
  CheckpointConfig c = parse_config(read_text_file(path), path);
  if (c.sharded_backend != "torch_dist")
    fail(path, "sharded_backend " + escaped_brief(c.sharded_backend) + " is not read (only torch_dist)");
  return c;
}

bool writes_legacy_common(const std::string& version) {
  int major = -1, minor = -1, used = 0;
  if (std::sscanf(version.c_str(), "%d.%d%n", &major, &minor, &used) != 2 || major < 0 || minor < 0 ||
      (used < static_cast<int>(version.size()) && version[used] != '.' && !std::isalpha(static_cast<unsigned char>(version[used]))))
    throw UsageError("--megatron-version " + escaped_brief(version) + ": expected a Megatron-Core release such as 0.16 or 0.19.0");
  return major == 0 && minor < 17;
}

}  // namespace ucpkit::formats::megatron_core
