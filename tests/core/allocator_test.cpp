// lib/core/allocator: after keep_large_buffers_on_heap, a large buffer comes from the heap, not from
// a fresh mmap (glibc's own statistics, mallinfo2, are the truth).
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "core/allocator.h"

namespace allocator_test {

TEST(Allocator, LargeBuffersStayOnTheHeap) {
  const size_t big = size_t{64} << 20;  // far above glibc's mmap threshold (128 KiB .. 32 MiB)
  const size_t mapped_before = mallinfo2().hblkhd;
  void* p = std::malloc(big);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 4096);
  const size_t mapped_default = mallinfo2().hblkhd;
  std::free(p);
  EXPECT_GE(mapped_default, mapped_before + big) << "glibc's default serves it with mmap";

  ucpkit::keep_large_buffers_on_heap({.trim_threshold = 1 << 30});
  const size_t mapped = mallinfo2().hblkhd;
  p = std::malloc(big);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, 4096);
  EXPECT_EQ(mallinfo2().hblkhd, mapped) << "served by mmap after the tuning";
  EXPECT_GE(mallinfo2().arena, big) << "not on the heap";
  std::free(p);
}

}  // namespace allocator_test
