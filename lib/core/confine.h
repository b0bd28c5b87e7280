// Where a tool may read and write: a file name taken from a file the tool reads (a work folder's
// plan.json, a universal checkpoint's manifest.json, a PEC store manifest) must stay inside the folder
// it names files of, and an output folder must never be, contain, or lie inside one of the inputs
// (with --overwrite the commit would delete the source).
#pragma once
#include <filesystem>
#include <string>

namespace ucpkit {

// `dir / name` when `name` is a relative path inside `dir` in normal form: not empty, not absolute,
// no empty, "." or ".." component, no NUL byte. Otherwise throws Error "<source>: <what> '<name>' is
// not a relative path inside <dir>" (`source`: the file the name was read from; `name` is escaped
// and cut in the message).
std::filesystem::path confined_path(const std::filesystem::path& dir, const std::string& name, const std::string& source,
                                    const std::string& what);

// True when `name` passes confined_path's rules.
bool is_confined_name(const std::string& name);

// True when `inner` is `outer` or lies inside it, after making both absolute and resolving symbolic
// links and ".." of the parts that exist (so an alias of a folder is the folder).
bool path_within(const std::filesystem::path& inner, const std::filesystem::path& outer);

// Throws UsageError when `output` and `input` are the same file or folder or one lies inside the
// other: "<output_option> <output> is | lies inside | holds <input_option> <input>: ...".
void refuse_output_over_input(const std::filesystem::path& output, const std::string& output_option,
                              const std::filesystem::path& input, const std::string& input_option);

}  // namespace ucpkit
