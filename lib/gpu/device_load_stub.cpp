// GPU path stand-in for builds without CUDA/NCCL: says so instead of crashing.
#ifndef UCPKIT_HAVE_CUDA
#include "core/error.h"
#include "gpu/device_load.h"

namespace ucpkit::gpu {

bool gpu_available(std::string* why) {
  if (why) *why = "ucpkit was built without CUDA/NCCL";
  return false;
}

DeviceLoadResult load_partition_to_device(const DeviceLoadRequest&) {
  throw Error("no GPU: ucpkit was built without CUDA/NCCL (--device cuda unavailable)");
}

}  // namespace ucpkit::gpu
#endif
