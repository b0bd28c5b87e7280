// "What is this folder?": the one answer every tool asks. Each format recognises its own
// folders and registers that test here from its folder under lib/formats/ (one `register_folder_format`
// at namespace scope); detect() asks them in their registered order and names what it looked for when
// none answers. No tool has a predicate of its own, and no folder falls back to being read as DeepSpeed.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ucpkit::formats {

// The names of the kinds ucpkit reads today (FolderKind::format); a new format adds its own name.
inline constexpr std::string_view kUniversal = "universal";
inline constexpr std::string_view kWorkFolder = "work-folder";
inline constexpr std::string_view kPecStore = "pec-store";
inline constexpr std::string_view kTorchDist = "torch_dist";
inline constexpr std::string_view kDcp = "dcp";
inline constexpr std::string_view kDeepSpeed = "deepspeed";
inline constexpr std::string_view kHf = "hf";

// What a folder is.
struct FolderKind {
  std::string format;   // the registered format that recognised it ("universal", "dcp", "deepspeed", ...)
  std::string flavour;  // a format's variant when it has several ("dcp-rank-local", "dcp-safetensors"), else ""
  bool is(std::string_view f) const { return format == f; }
  // The flavour when there is one, else the format: what messages and `--json` call it.
  const std::string& name() const { return flavour.empty() ? format : flavour; }
};

// A format's answer to "is this folder mine?".
struct FolderFormat {
  std::string format;      // FolderKind::format
  int order = 0;           // asked in ascending order: formats with more specific markers first
  std::string looked_for;  // what the test looks for, for the unknown-folder message ("manifest.json (universal)")
  // nullopt: not this format's folder; else its flavour ("" for none). May throw Error naming a file
  // that marks the folder as this format's but is damaged.
  std::function<std::optional<std::string>(const std::string& dir)> recognise;
  // Whether a top-level name belongs to this format's folders (what `--overwrite` may replace).
  std::function<bool(const std::string& name)> owns_entry;
};

// An owns_entry test of exact names, name prefixes and name suffixes.
std::function<bool(const std::string& name)> entry_names(std::vector<std::string> names,
                                                         std::vector<std::string> prefixes = {},
                                                         std::vector<std::string> suffixes = {});

// Registers a format; returns true (for a namespace-scope initializer in the format's own file).
bool register_folder_format(FolderFormat format);

// The kind of the folder `path`. Throws Error naming it when it does not exist or is no folder, and
// "<path>: not a checkpoint ucpkit reads: no <what each format looks for>" when no format recognises it.
FolderKind detect(const std::string& path);

// detect() without the unknown-folder error: nullopt when no format recognises `path` (or it is no
// folder). For the checks that ask "is it this kind?" of an optional folder.
std::optional<FolderKind> try_detect(const std::string& path);

// Whether `path` is a folder of `format` (try_detect's kind, false when unknown).
bool is_kind(const std::string& path, std::string_view format);

// The registered formats' names, in detection order.
std::vector<std::string> folder_formats();

}  // namespace ucpkit::formats
