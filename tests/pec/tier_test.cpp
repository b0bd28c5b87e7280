// The store tier names: the manifest JSON spells them "durable" and "fast" (as before the enum), and a
// manifest naming another tier is refused like a damaged one.
#include <gtest/gtest.h>

#include "core/error.h"
#include "pec/manifest.h"
#include "pec/tier.h"

namespace tier_test {

using namespace ucpkit;
using namespace ucpkit::pec;

TEST(PecTier, NamesRoundTrip) {
  EXPECT_EQ(to_string(Tier::durable), "durable");
  EXPECT_EQ(to_string(Tier::fast), "fast");
  for (Tier t : {Tier::durable, Tier::fast}) EXPECT_EQ(parse_tier(to_string(t), "m.json"), t);
}

TEST(PecTier, ManifestKeepsTheTierStringAndRefusesAnUnknownOne) {
  Manifest m;
  m.step = 5;
  m.tier = Tier::fast;
  nlohmann::json j = manifest_to_json(m);
  EXPECT_EQ(j["tier"], "fast");
  EXPECT_EQ(manifest_from_json(j, "m.json").tier, Tier::fast);
  j["tier"] = "Fast";
  try {
    (void)manifest_from_json(j, "step-5.json");
    ADD_FAILURE() << "an unknown tier was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step-5.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unknown store tier 'Fast'"), std::string::npos) << e.what();
  }
}

}  // namespace tier_test
