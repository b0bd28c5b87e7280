// ucpkit_layout.json: what a ucp-load output folder holds, and how it differs from a request.
#include "reshard/layout_record.h"

#include <filesystem>
#include <system_error>

#include "core/atomic_file.h"
#include "core/json_input.h"
#include "reshard/target_defaults.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

namespace {
constexpr int kLayoutRecordVersion = 1;
}  // namespace

nlohmann::json layout_record(const UcpInfo& plan, const ModelInfo& model) {
  const TargetLayout& t = plan.target;
  nlohmann::json j = {{"format", kLayoutRecordFormat},
                      {"version", kLayoutRecordVersion},
                      {"tool", "ucp-load"},
                      {"tp", t.tp},
                      {"pp", t.pp},
                      {"dp", t.dp},
                      {"ep", t.ep},
                      {"zero_stage", t.zero_stage},
                      {"dtype", dtype_option_name(t.dtype)},
                      {"optimizer", t.bf16_optimizer ? "bf16" : "zero"},
                      {"padded_vocab", plan.padded_vocab},
                      {"tag", model.tag}};
  if (t.zero_stage == 3) j["sub_group_size"] = t.sub_group_size;
  if (model.native_moe) j["ds_line"] = t.ds_line.empty() ? model.ds_line : t.ds_line;
  return j;
}

std::optional<nlohmann::json> read_layout_record(const std::string& output) {
  const fs::path path = fs::path(output) / kLayoutRecordName;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  nlohmann::json j;
  try {
    if (!try_parse_json_input(read_text_file(path.string()), path.string(), j)) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;  // unreadable: as if there were none (the folder is converted again)
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kLayoutRecordFormat) return std::nullopt;
  return j;
}

std::string layout_difference(const nlohmann::json& have, const nlohmann::json& want) {
  std::string out;
  for (const auto& [key, value] : want.items()) {
    if (key == "tool") continue;
    const auto it = have.find(key);
    if (it != have.end() && *it == value) continue;
    const std::string had = it == have.end() ? "not recorded" : it->dump();
    out += (out.empty() ? "" : ", ") + key + " " + had + " (requested " + value.dump() + ")";
  }
  return out;
}

}  // namespace ucpkit::reshard
