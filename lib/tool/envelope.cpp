// The --json envelope.
#include "tool/envelope.h"

#include <chrono>
#include <iostream>

#include "tool/tool.h"
#include "ucpkit/version.h"

namespace ucpkit::tool {

namespace {

const auto g_started = std::chrono::steady_clock::now();

nlohmann::ordered_json wrap(const std::string& tool, nlohmann::ordered_json output, const nlohmann::json& fields) {
  nlohmann::ordered_json j;
  j["tool"] = tool;
  j["version"] = UCPKIT_VERSION;
  j["schema_version"] = kSchemaVersion;
  j["output"] = std::move(output);
  j["seconds"] = seconds_since_start();
  if (fields.is_object())
    for (const auto& [key, value] : fields.items())
      if (!j.contains(key)) j[key] = value;
  return j;
}

}  // namespace

// Paths are bytes, not UTF-8: a folder name with a byte 0xff made dump() throw (type_error.316) after
// the run had committed, so the tool exited 1 with no file named and no JSON. Invalid UTF-8 is
// written as U+FFFD: the output stays valid JSON and the exit code is the run's.
void print_json(const nlohmann::ordered_json& summary) {
  summary_printed();
  std::cout << summary.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
}

double seconds_since_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_started).count();
}

nlohmann::ordered_json envelope(const std::string& tool, const std::string& output, const nlohmann::json& fields) {
  return wrap(tool, output, fields);
}

nlohmann::ordered_json envelope(const std::string& tool, std::nullptr_t, const nlohmann::json& fields) {
  return wrap(tool, nullptr, fields);
}

}  // namespace ucpkit::tool
