// The entry points of the GPU module (libucpkit_gpu.so, built from gpu/cuda/ with CUDA + NCCL) that
// libucpkit looks up after dlopen() (gpu/device_load.cpp). Only this module links libcudart and libnccl,
// so the tools and libucpkit start on a machine without CUDA libraries.
#pragma once
#include <string>

#include "gpu/device_load.h"

// Bumped when the request or result structs change: a module of another build is refused.
#define UCPKIT_GPU_MODULE_ABI 1

extern "C" {
int ucpkit_gpu_module_abi();
bool ucpkit_gpu_available(std::string* why);
void ucpkit_gpu_load_partition(const ucpkit::gpu::DeviceLoadRequest& request, ucpkit::gpu::DeviceLoadResult& result);
}
