// bench_torch_io: loads a torch.save file with ucpkit's reader and reads every byte of every tensor
// (a checksum: the sum of each tensor's bytes read as little-endian 64-bit words, the last one
// zero-padded, mod 2^64, which bench/bench_torch_io.sh compares with the same sum from Python torch).
// Usage: bench_torch_io <file.pt>   Prints: tensors, bytes, checksum, load_s, read_s, total_s.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "io/torch/torch_file.h"

namespace {

using ucpkit::pickle::Value;

uint64_t checksum(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  size_t words = n / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t v;
    std::memcpy(&v, p + 8 * i, 8);
    s += v;
  }
  if (n % 8) {
    uint64_t v = 0;
    std::memcpy(&v, p + 8 * words, n % 8);
    s += v;
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <file.pt>\n", argv[0]);
    return 2;
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    ucpkit::TorchFile tf = ucpkit::load_torch_file(argv[1]);
    auto t1 = std::chrono::steady_clock::now();
    size_t tensors = 0;
    uint64_t bytes = 0, sum = 0;
    std::vector<const Value*> work{tf.root.get()};
    std::unordered_set<const Value*> seen;
    std::vector<uint8_t> buf;
    while (!work.empty()) {
      const Value* v = work.back();
      work.pop_back();
      if (!v || !seen.insert(v).second) continue;
      for (const auto& it : v->items) work.push_back(it.get());
      for (auto it = v->entries.rbegin(); it != v->entries.rend(); ++it) work.push_back(it->second.get());
      if (!v->tensor) continue;
      const ucpkit::Tensor& t = *v->tensor;
      const uint8_t* p;
      if (t.is_contiguous()) {
        p = t.contiguous_bytes().data();
      } else {
        buf.resize(t.nbytes());
        t.copy_to(buf.data());
        p = buf.data();
      }
      sum += checksum(p, t.nbytes());
      bytes += t.nbytes();
      ++tensors;
    }
    auto t2 = std::chrono::steady_clock::now();
    auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    std::printf("tensors %zu\nbytes %llu\nchecksum %llu\nload_s %.3f\nread_s %.3f\ntotal_s %.3f\n", tensors,
                static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(sum), s(t0, t1), s(t1, t2),
                s(t0, t2));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_torch_io: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
