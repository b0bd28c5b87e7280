// GPU path of ucp-load: materializes one target rank's ZeRO partition (fp32 master weights and
// optimizer states) directly in GPU memory. Members of a DP group each read a disjoint share of the
// atomic files and NCCL all-gather gives every member the whole group buffer it slices from.
// The work runs in the GPU module libucpkit_gpu.so (gpu/cuda/, built when UCPKIT_CUDA is ON), which
// these functions load on first use: a missing module or CUDA library is an Error("no GPU: ...").
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ucpkit::gpu {

struct DeviceLoadRequest {
  std::string universal_dir;
  int tp = 1, pp = 1, dp = 1, zero_stage = 1;
  int pp_rank = 0, tp_rank = 0, dp_rank = 0;  // the target rank this process materializes
  bool verify = true;                          // checksums of the atomic tensors vs the manifest
};

struct DeviceLoadResult {
  uint64_t bytes_to_device = 0;   // bytes copied host -> device
  double seconds = 0;             // device time of the host -> device DMAs (CUDA events)
  double gbps = 0;                // bytes_to_device / seconds / 1e9: the transfer stage alone
  double end_to_end_seconds = 0;  // from the call to every partition on the device (set-up, checksum
  double end_to_end_gbps = 0;     // verification, reading the universal files, DMAs), read-back excluded
  double baseline_gbps = 0;       // plain pinned-memory cudaMemcpy of the same bytes, same run
  std::map<std::string, double> phase_seconds;  // setup, verify, stage, device_check
  int threads = 0;                // TBB threads that filled the staging buffers
  std::vector<uint32_t> partition_crc32;  // per group and state, of the bytes read back from the device
  int device = -1;
};

// True when a CUDA device is usable (false without the GPU module, its CUDA libraries or a GPU).
bool gpu_available(std::string* why = nullptr);

// Loads the partition; throws Error("no GPU: ...") when no device is usable.
DeviceLoadResult load_partition_to_device(const DeviceLoadRequest& request);

}  // namespace ucpkit::gpu
