// pec/source_layout: the names manifests spell, both ways; an unknown one is refused naming the manifest.
#include "pec/source_layout.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace source_layout_test {

using namespace ucpkit::pec;

TEST(PecSourceLayout, NamesRoundTrip) {
  EXPECT_EQ(to_string(SourceLayout::DeepSpeedMoe), "deepspeed-moe");
  EXPECT_EQ(to_string(SourceLayout::DeepSpeedAutoEpZero3), "deepspeed-autoep-zero3");
  EXPECT_EQ(to_string(SourceLayout::Universal), "universal");
  for (SourceLayout l : {SourceLayout::DeepSpeedMoe, SourceLayout::DeepSpeedAutoEpZero3, SourceLayout::Universal})
    EXPECT_EQ(parse_source_layout(to_string(l), "m.json"), l);
}

TEST(PecSourceLayout, UnknownNameIsRefusedNamingTheManifest) {
  try {
    parse_source_layout("megatron", "/s/durable/step_100.json");
    FAIL() << "accepted";
  } catch (const ucpkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/s/durable/step_100.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unknown source layout 'megatron'"), std::string::npos) << e.what();
  }
}

}  // namespace source_layout_test
