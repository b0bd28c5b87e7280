// tool::envelope: the --json summary's first keys, in order, and the tool's own fields after them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tool/envelope.h"
#include "ucpkit/version.h"

namespace envelope_test {

using ucpkit::tool::envelope;

namespace {
std::vector<std::string> keys_of(const nlohmann::ordered_json& j) {
  std::vector<std::string> k;
  for (const auto& [key, value] : j.items()) k.push_back(key);
  return k;
}
}  // namespace

TEST(Envelope, FirstKeysThenTheToolsFieldsInTheirOrder) {
  const nlohmann::json fields = {{"params", 12}, {"files_written", 3}, {"tool", "old"}, {"seconds", -1.0}};
  const auto j = envelope("ucp-load", "out/target", fields);
  const std::vector<std::string> want = {"tool", "version", "schema_version", "output", "seconds", "files_written", "params"};
  EXPECT_EQ(keys_of(j), want);
  EXPECT_EQ(j["tool"], "ucp-load");
  EXPECT_EQ(j["version"], UCPKIT_VERSION);
  EXPECT_EQ(j["schema_version"], ucpkit::tool::kSchemaVersion);
  EXPECT_EQ(j["output"], "out/target");
  EXPECT_GE(j["seconds"].get<double>(), 0.0) << "the envelope's own wall time replaces the field";
  EXPECT_EQ(j["params"], 12);
  EXPECT_EQ(j["files_written"], 3);
  // printed and read back, the order stays (ordered keys)
  const auto back = nlohmann::ordered_json::parse(j.dump(2));
  EXPECT_EQ(keys_of(back), want);
}

TEST(Envelope, NothingWrittenIsNull) {
  const auto j = envelope("pec-restore", nullptr, {{"dry_run", true}});
  EXPECT_TRUE(j["output"].is_null());
  EXPECT_EQ(j["dry_run"], true);
  EXPECT_EQ(keys_of(envelope("moe-replace", nullptr, nlohmann::json::object())).size(), 5u);
}

TEST(Envelope, SecondsGrow) {
  const double a = ucpkit::tool::seconds_since_start();
  const double b = envelope("x", "y", {})["seconds"].get<double>();
  EXPECT_GE(b, a);
  EXPECT_GE(a, 0.0);
}

}  // namespace envelope_test
