#include "core/node_pool.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace ucpkit {
namespace node_pool_test {

struct Node {
  std::string text;
  std::vector<int> items;
  double weight = 0;
};

TEST(NodePool, ABlockFreedIsTheNextOneTaken) {
  using Blocks = FreeBlocks<sizeof(Node) + 24>;
  void* a = Blocks::take();
  const size_t before = Blocks::kept();
  Blocks::give(a);
  EXPECT_EQ(Blocks::kept(), before + 1);
  EXPECT_EQ(Blocks::take(), a);
  EXPECT_EQ(Blocks::kept(), before);
  Blocks::give(a);
}

TEST(NodePool, KeepsAtMostItsLimitAndFreesTheRest) {
  using Blocks = FreeBlocks<40>;
  std::vector<void*> taken(Blocks::kKeep + 100);
  for (void*& p : taken) p = Blocks::take();
  for (void* p : taken) Blocks::give(p);
  EXPECT_EQ(Blocks::kept(), Blocks::kKeep);
}

TEST(NodePool, SharedNodesLiveAndDieAsMakeSharedOnes) {
  std::vector<std::shared_ptr<Node>> nodes;
  for (int i = 0; i < 1000; ++i) {
    auto n = make_node<Node>(Node{std::string(100, static_cast<char>('a' + i % 26)), {i, i + 1}, i * 0.5});
    std::weak_ptr<Node> w = n;
    nodes.push_back(std::move(n));
    EXPECT_FALSE(w.expired());
  }
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(nodes[static_cast<size_t>(i)]->text, std::string(100, static_cast<char>('a' + i % 26)));
    EXPECT_EQ(nodes[static_cast<size_t>(i)]->items[1], i + 1);
  }
  std::weak_ptr<Node> first = nodes.front();
  nodes.clear();
  EXPECT_TRUE(first.expired());
  // Made on one thread, dropped on another (pickle values decoded on a worker, released by the caller).
  std::shared_ptr<Node> there;
  std::thread([&] { there = make_node<Node>(Node{"made on a worker", {7}, 1}); }).join();
  EXPECT_EQ(there->text, "made on a worker");
  there.reset();
}

}  // namespace node_pool_test
}  // namespace ucpkit
