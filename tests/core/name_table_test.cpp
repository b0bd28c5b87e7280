// lib/core/name_table.h: positions found by the names the caller keeps, through growth from empty and from a
// reserve; a name added twice gives the position it has, and nothing is added.
#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "core/name_table.h"

namespace name_table_test {

using ucpkit::NameTable;

TEST(NameTable, FindsEveryNameThroughGrowthAndRefusesARepeat) {
  for (const bool reserved : {false, true}) {
    std::vector<std::string> names;
    for (int k = 0; k < 10000; ++k) names.push_back("layers." + std::to_string(k % 97) + ".w" + std::to_string(k));
    auto name_of = [&](uint32_t k) -> std::string_view { return names[k]; };
    NameTable t;
    if (reserved) t.reserve(names.size());
    EXPECT_EQ(t.find("layers.0.w0", name_of), std::nullopt);  // empty
    for (uint32_t k = 0; k < names.size(); ++k) EXPECT_EQ(t.add(names[k], k, name_of), std::nullopt) << names[k];
    EXPECT_EQ(t.size(), names.size());
    for (uint32_t k = 0; k < names.size(); ++k) EXPECT_EQ(t.find(names[k], name_of), k) << names[k];
    EXPECT_EQ(t.find("layers.0.w", name_of), std::nullopt);
    EXPECT_EQ(t.find("", name_of), std::nullopt);
    names.push_back(names[4321]);  // the same name again, at another position
    EXPECT_EQ(t.add(names.back(), static_cast<uint32_t>(names.size() - 1), name_of), 4321u);
    EXPECT_EQ(t.size(), names.size() - 1);
    EXPECT_EQ(t.find(names[4321], name_of), 4321u);
  }
}

}  // namespace name_table_test
