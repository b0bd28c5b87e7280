// lib/formats/dcp/read_ahead: the tensors read ahead are whole()'s, in any order they are asked for (next, skipped
// ahead to, asked again, too large to read ahead); an error reaches the caller at its entry and the reading ends
// there; while the reader waits for room (by count or bytes) every tensor still comes once; the reading thread stops
// when the function goes, even while it waits for room; read_order follows the plan's write order. (ucp-load's DCP
// reshards run through it: tests/reshard, kill_campaign_dcp.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "formats/dcp/read_ahead.h"

namespace dcp_read_ahead_test {

using namespace ucpkit;
using namespace ucpkit::formats::dcp;

namespace {

// Entries e0..e<n-1> of `values` float32 values each (the last `large` of them 64 KB).
std::vector<Entry> entries(size_t n, int64_t values, size_t large = 0) {
  std::vector<Entry> out(n);
  for (size_t k = 0; k < n; ++k) {
    out[k].fqn = "e" + std::to_string(k);
    out[k].size = {k + large >= n ? int64_t{16384} : values};
  }
  return out;
}

// The tensor of an entry: its number in every value.
Tensor made(const Entry& e) {
  const float v = static_cast<float>(std::stoi(e.fqn.substr(1)));
  std::vector<uint8_t> bytes(static_cast<size_t>(e.size[0]) * 4);
  for (size_t i = 0; i < bytes.size(); i += 4) std::memcpy(bytes.data() + i, &v, 4);
  return Tensor::from_bytes(DType::Float32, e.size, std::move(bytes));
}

float first(const Tensor& t) {
  float v;
  std::memcpy(&v, t.contiguous_bytes().data(), 4);
  return v;
}

std::vector<const Entry*> all(const std::vector<Entry>& es) {
  std::vector<const Entry*> out;
  for (const Entry& e : es) out.push_back(&e);
  return out;
}

}  // namespace

TEST(DcpReadAhead, GivesWholeTensorsInAnyOrderAskedFor) {
  const std::vector<Entry> es = entries(40, 256, 2);  // e38, e39: 64 KB, over the 16 KB read ahead below
  std::atomic<int> calls{0};
  std::map<std::string, int> per_entry;
  std::mutex mu;
  auto whole = [&](const Entry& e) {
    ++calls;
    std::lock_guard<std::mutex> lock(mu);
    ++per_entry[e.fqn];
    return made(e);
  };
  auto get = read_ahead(whole, all(es), 4096, 16384);
  for (size_t k : {0, 1, 2, 5, 6, 3, 7, 20, 21, 20, 39, 38, 22}) {  // skips 3-4, 8-19; asks 3 and 20 again
    const Tensor t = get(es[k]);
    EXPECT_EQ(t.shape(), es[k].size);
    EXPECT_EQ(first(t), static_cast<float>(k)) << es[k].fqn;
  }
  get = nullptr;  // the reading thread stops and is joined
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(per_entry["e38"], 1);  // too large: read when asked, once
  EXPECT_EQ(per_entry["e3"], 2);   // dropped when skipped, then read again when asked
  EXPECT_EQ(per_entry["e20"], 2);
  EXPECT_EQ(per_entry["e0"], 1);
}

// The reader waits for room, by count (3,000 small tensors: more than wait at once) and by bytes, and is woken in
// batches: every tensor still comes once, in order, and none is read twice.
TEST(DcpReadAhead, WaitingForRoomByCountOrBytesEveryTensorComesOnce) {
  for (const auto& [n, values, max_bytes] : {std::tuple<size_t, int64_t, uint64_t>{3000, 4, uint64_t{16} << 20},
                                             std::tuple<size_t, int64_t, uint64_t>{300, 1024, 16384}}) {
    const std::vector<Entry> es = entries(n, values);
    std::atomic<int> calls{0};
    auto get = read_ahead([&](const Entry& e) { return ++calls, made(e); }, all(es), max_bytes);
    for (size_t k = 0; k < n; ++k) {
      if (k % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the reader fills the room
      ASSERT_EQ(first(get(es[k])), static_cast<float>(k)) << n;
    }
    EXPECT_EQ(calls.load(), static_cast<int>(n));
  }
}

TEST(DcpReadAhead, AnErrorReachesItsEntryAndTheReadingEndsThere) {
  const std::vector<Entry> es = entries(10, 16);
  std::atomic<int> calls{0};
  auto get = read_ahead(
      [&](const Entry& e) {
        ++calls;
        if (e.fqn == "e4") throw std::runtime_error("bad item e4");
        return made(e);
      },
      all(es));
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(first(get(es[k])), static_cast<float>(k));
  try {
    get(es[4]);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "bad item e4");
  }
  EXPECT_EQ(first(get(es[7])), 7.0f);  // read by the caller: the reading thread stopped at e4
  EXPECT_EQ(calls.load(), 6);
}

TEST(DcpReadAhead, StopsWhileWaitingForRoomLeavingBytesEntriesOut) {
  std::vector<Entry> es = entries(50, 1024);  // 4 KB each, room for 2
  es[1].is_bytes = true;
  std::atomic<int> calls{0};
  {
    auto get = read_ahead([&](const Entry& e) { return ++calls, made(e); }, all(es), 8192);
    EXPECT_EQ(first(get(es[0])), 0.0f);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }  // gone while the thread waits for room: joined, not hung
  EXPECT_LT(calls.load(), 10);
}

TEST(DcpReadAhead, ReadOrderFollowsTheWriteOrder) {
  SavePlan plan;
  plan.entries = entries(4, 8);
  plan.entries[2].is_bytes = true;
  EXPECT_EQ(read_order(plan), (std::vector<const Entry*>{&plan.entries[0], &plan.entries[1], &plan.entries[3]}));
  plan.write_order = {{3, 0}, {3, 1}, {0, 0}, {2, PlannedItem::kBytes}, {1, 0}, {0, 1}};
  EXPECT_EQ(read_order(plan),
            (std::vector<const Entry*>{&plan.entries[3], &plan.entries[0], &plan.entries[1], &plan.entries[0]}));
}

}  // namespace dcp_read_ahead_test
