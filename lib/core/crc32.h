// CRC-32 (zip / gzip polynomial, the value zlib's crc32() gives), fast on x86 with PCLMULQDQ or VPCLMULQDQ.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace ucpkit {

// CRC-32 of `data` continuing from `crc` (0 to start), on the calling thread. Uses carry-less
// multiplication folding when the CPU has PCLMULQDQ, zlib otherwise; the result is identical.
uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> data);

// Same value, large inputs split into chunks checksummed in parallel (TBB) and combined.
uint32_t crc32_parallel(std::span<const uint8_t> data, uint32_t crc = 0);

// CRC-32 of A followed by B from crc(A), crc(B) and B's length (zlib's crc32_combine).
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// CRC-32 of `n` zero bytes, in O(log n) combines (a record written as a hole of the file, core/atomic_file skip).
uint32_t crc32_zeros(uint64_t n);

// Whether crc32_update uses the PCLMULQDQ path on this machine (for benchmarks and tests).
bool crc32_accelerated();

// The implementations crc32_update chooses among (the widest this CPU has), each giving zlib's value: zlib's own;
// 128-bit carry-less multiplies (PCLMULQDQ, SSE4.1); 512-bit ones (VPCLMULQDQ, AVX-512F/BW) for 256 bytes or more.
// For tests and benchmarks; crc32_update_kernel throws Error for a kernel the CPU lacks.
enum class Crc32Kernel { zlib, pclmul, vpclmul };
bool crc32_kernel_available(Crc32Kernel k);
uint32_t crc32_update_kernel(Crc32Kernel k, uint32_t crc, std::span<const uint8_t> data);

}  // namespace ucpkit
