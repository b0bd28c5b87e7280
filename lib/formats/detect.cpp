// The one detection of a folder's kind (detect.h).
#include "formats/detect.h"

#include <algorithm>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "formats/looked_for.h"

namespace fs = std::filesystem;

namespace ucpkit::formats {

namespace {

struct Formats {
  std::mutex mu;
  std::vector<FolderFormat> list;  // sorted by order, then name
};

Formats& registered() {
  static Formats f;
  return f;
}

std::vector<FolderFormat> snapshot() {
  auto& r = registered();
  std::lock_guard lock(r.mu);
  return r.list;
}

bool is_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

std::optional<FolderKind> recognised(const std::string& path) {
  for (const auto& f : snapshot())
    if (auto flavour = f.recognise(path)) return FolderKind{f.format, *flavour};
  return std::nullopt;
}

}  // namespace

std::function<bool(const std::string&)> entry_names(std::vector<std::string> names, std::vector<std::string> prefixes,
                                                    std::vector<std::string> suffixes) {
  return [names = std::move(names), prefixes = std::move(prefixes), suffixes = std::move(suffixes)](const std::string& n) {
    auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
    return std::find(names.begin(), names.end(), n) != names.end() ||
           std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return n.rfind(p, 0) == 0; }) ||
           std::any_of(suffixes.begin(), suffixes.end(), ends);
  };
}

bool register_folder_format(FolderFormat format) {
  auto& r = registered();
  std::lock_guard lock(r.mu);
  r.list.erase(std::remove_if(r.list.begin(), r.list.end(), [&](const FolderFormat& f) { return f.format == format.format; }),
               r.list.end());
  r.list.push_back(std::move(format));
  std::stable_sort(r.list.begin(), r.list.end(), [](const FolderFormat& a, const FolderFormat& b) {
    return a.order != b.order ? a.order < b.order : a.format < b.format;
  });
  return true;
}

FolderKind detect(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(path + ": no such folder");
  if (!fs::is_directory(path, ec)) throw Error(path + ": not a folder");
  if (auto kind = recognised(path)) return *kind;
  throw Error(not_a_checkpoint(path));
}

std::optional<FolderKind> try_detect(const std::string& path) {
  if (!is_folder(path)) return std::nullopt;
  return recognised(path);
}

bool is_kind(const std::string& path, std::string_view format) {
  const auto kind = try_detect(path);
  return kind && kind->is(format);
}

std::vector<std::string> folder_formats() {
  std::vector<std::string> out;
  for (const auto& f : snapshot()) out.push_back(f.format);
  return out;
}

std::string not_a_checkpoint(const std::string& path, const std::string& where) {
  std::string looked;
  for (const auto& f : snapshot()) looked += (looked.empty() ? "" : ", ") + f.looked_for;
  return path + ": not a checkpoint ucpkit reads: no " + looked + (where.empty() ? std::string() : " in " + where);
}

bool registered_entry(const std::string& name) {
  const auto list = snapshot();
  return std::any_of(list.begin(), list.end(), [&](const FolderFormat& f) { return f.owns_entry && f.owns_entry(name); });
}

}  // namespace ucpkit::formats
