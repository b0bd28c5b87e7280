// The --device cuda path as libucpkit sees it: the GPU module (libucpkit_gpu.so, beside libucpkit in
// the same folder, build tree or install prefix) is dlopen()ed on first use, so no tool and not
// libucpkit itself needs libcudart or libnccl to start.
#include "gpu/device_load.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "gpu/module_abi.h"
#include "ucpkit/version.h"

namespace fs = std::filesystem;

namespace ucpkit::gpu {

namespace {

constexpr const char* kModule = "libucpkit_gpu.so";

struct Module {
  decltype(&ucpkit_gpu_available) available = nullptr;
  decltype(&ucpkit_gpu_load_partition) load = nullptr;
  std::string error;  // why it cannot be used; empty when loaded
};

// The folder libucpkit was loaded from: the module is installed beside it.
fs::path library_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&library_folder), &info) == 0 || !info.dli_fname) return {};
  return fs::path(info.dli_fname).parent_path().lexically_normal();
}

Module open_module() {
  Module m;
  const fs::path path = library_folder() / kModule;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    m.error = UCPKIT_CUDA_MODULE ? "the GPU module " + path.string() + " is not installed (Debian: package ucpkit-gpu)"
                                 : std::string("ucpkit was built without CUDA/NCCL (UCPKIT_CUDA=OFF)");
    m.error += ": --device cuda unavailable";
    return m;
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    m.error = "cannot load the GPU module " + path.string() + ": " + escaped_brief(e ? e : "unknown error", 200) +
              " (--device cuda needs the CUDA runtime and NCCL libraries)";
    return m;
  }
  auto abi = reinterpret_cast<decltype(&ucpkit_gpu_module_abi)>(dlsym(handle, "ucpkit_gpu_module_abi"));
  m.available = reinterpret_cast<decltype(m.available)>(dlsym(handle, "ucpkit_gpu_available"));
  m.load = reinterpret_cast<decltype(m.load)>(dlsym(handle, "ucpkit_gpu_load_partition"));
  if (!abi || !m.available || !m.load || abi() != UCPKIT_GPU_MODULE_ABI) {
    m.available = nullptr;
    m.load = nullptr;
    m.error = "the GPU module " + path.string() + " does not belong to this build of libucpkit";
  }
  return m;
}

const Module& module() {
  static std::once_flag once;
  static Module m;
  std::call_once(once, [] { m = open_module(); });
  return m;
}

}  // namespace

bool gpu_available(std::string* why) {
  const Module& m = module();
  if (!m.available) {
    if (why) *why = m.error;
    return false;
  }
  return m.available(why);
}

DeviceLoadResult load_partition_to_device(const DeviceLoadRequest& request) {
  const Module& m = module();
  if (!m.load) throw Error("no GPU: " + m.error);
  DeviceLoadResult result;
  m.load(request, result);
  return result;
}

}  // namespace ucpkit::gpu
