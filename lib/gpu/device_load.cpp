// GPU path: one target rank's ZeRO partition materialized in device memory, DP-group members
// reading disjoint shares and exchanging the replicated low-precision weights over NCCL.
#ifdef UCPKIT_HAVE_CUDA
#include "gpu/device_load.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "load/deepspeed_writer.h"
#include "load/model_info.h"
#include "load/ucp_info.h"
#include "load/universal_reader.h"
#include "ucp/mpi_session.h"
#include "ucp/save.h"

namespace fs = std::filesystem;

namespace ucpkit::gpu {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("NCCL: ") + what + ": " + ncclGetErrorString(r));
}

// Pinned host staging buffer, freed on scope exit.
struct Pinned {
  void* p = nullptr;
  explicit Pinned(size_t n) { cuda_check(cudaMallocHost(&p, n ? n : 1), "cudaMallocHost"); }
  ~Pinned() { cudaFreeHost(p); }
};
struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(size_t n) { cuda_check(cudaMalloc(&p, n ? n : 1), "cudaMalloc"); }
  ~DeviceBuf() { cudaFree(p); }
};

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

bool gpu_available(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return true;
}

DeviceLoadResult load_partition_to_device(const DeviceLoadRequest& req) {
  std::string why;
  if (!gpu_available(&why)) throw Error("no GPU: " + why);
  auto& mpi = ucp::MpiSession::get();
  load::ModelInfo model = load::read_model_info(req.universal_dir);
  load::TargetLayout t;
  t.tp = req.tp;
  t.pp = req.pp;
  t.dp = req.dp;
  t.zero_stage = req.zero_stage;
  t.dtype = DType::BFloat16;
  t.bf16_optimizer = req.zero_stage == 0;
  const load::UcpInfo plan = load::ucp_info(model, t);
  const int mp = req.pp_rank * req.tp + req.tp_rank;
  const auto& mr = plan.mp_ranks.at(mp);

  // A DP group spread over MPI ranks (one per DP rank) exchanges over NCCL; else one process does all.
  const bool group = mpi.active() && mpi.size() == req.dp && req.dp > 1;
  const int me = group ? mpi.rank() : req.dp_rank;
  int devices = 0;
  cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  DeviceLoadResult res;
  res.device = group ? me % devices : 0;
  cuda_check(cudaSetDevice(res.device), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  if (group) {
    ncclUniqueId id;
    std::string s;
    if (mpi.rank() == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      s.assign(reinterpret_cast<const char*>(&id), sizeof id);
    }
    s = mpi.broadcast(s);
    std::memcpy(&id, s.data(), sizeof id);
    nccl_check(ncclCommInitRank(&comm, req.dp, id, me), "ncclCommInitRank");
  }
  cudaStream_t stream;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");

  load::UniversalReader reader(model, req.universal_dir, req.verify);
  load::DeepSpeedWriter writer(model, plan, reader,
                               load_torch((fs::path(req.universal_dir) / "zero" / "optimizer_state.pt").string()));
  if (req.verify)  // each DP member verifies a disjoint share of the atomic tensors
    for (size_t i = 0; i < model.params.size(); ++i)
      if (static_cast<int>(i % (group ? req.dp : 1)) == (group ? me : 0))
        for (const auto& st : model.states) reader.check(static_cast<int>(i), st);
  std::vector<std::unique_ptr<DeviceBuf>> keep;
  double copy_seconds = 0;
  uint64_t bytes = 0;
  for (size_t gi = 0; gi < mr.groups.size(); ++gi) {
    const auto& g = mr.groups[gi];
    const size_t part_bytes = static_cast<size_t>(g.partition) * 4;
    // fp32 master partition and optimizer states: this rank's own share, read by this rank only.
    for (const auto& state : model.states) {
      Tensor host = writer.partition_tensor(g, me, state);
      Pinned pin(part_bytes);
      std::memcpy(pin.p, host.contiguous_bytes().data(), part_bytes);
      auto dev = std::make_unique<DeviceBuf>(part_bytes);
      const auto t0 = Clock::now();
      cuda_check(cudaMemcpyAsync(dev->p, pin.p, part_bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      copy_seconds += since(t0);
      bytes += part_bytes;
      // Checksum of what reached the device (read back): proves the copy, compared by tests.
      std::vector<uint8_t> back(part_bytes);
      cuda_check(cudaMemcpy(back.data(), dev->p, part_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy back");
      if (std::memcmp(back.data(), pin.p, part_bytes) != 0) throw Error("device copy differs from the host partition");
      res.partition_crc32.push_back(ucp::tensor_crc32(host));
      keep.push_back(std::move(dev));
    }
    // Low-precision weights are replicated over DP: each member converts its share, NCCL all-gathers.
    if (group) {
      Tensor host = writer.partition_tensor(g, me, "fp32");
      const size_t lp_part = static_cast<size_t>(g.partition) * 2;
      Pinned pin(lp_part);
      load::convert_from_fp32(reinterpret_cast<const float*>(host.contiguous_bytes().data()),
                              static_cast<size_t>(g.partition), DType::BFloat16, static_cast<uint8_t*>(pin.p));
      auto full = std::make_unique<DeviceBuf>(lp_part * req.dp);
      const auto t0 = Clock::now();
      uint8_t* mine = static_cast<uint8_t*>(full->p) + lp_part * me;
      cuda_check(cudaMemcpyAsync(mine, pin.p, lp_part, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
      nccl_check(ncclAllGather(mine, full->p, static_cast<size_t>(g.partition), ncclBfloat16, comm, stream),
                 "ncclAllGather");
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      copy_seconds += since(t0);
      bytes += lp_part;
      keep.push_back(std::move(full));
    }
  }
  // Baseline in the same run: one plain pinned cudaMemcpy of the same number of bytes.
  {
    Pinned pin(bytes);
    std::memset(pin.p, 1, bytes);
    DeviceBuf dev(bytes);
    const auto t0 = Clock::now();
    cuda_check(cudaMemcpy(dev.p, pin.p, bytes, cudaMemcpyHostToDevice), "baseline cudaMemcpy");
    const double s = since(t0);
    res.baseline_gbps = s > 0 ? bytes / s / 1e9 : 0;
  }
  cudaStreamDestroy(stream);
  if (comm) ncclCommDestroy(comm);
  res.bytes_to_device = bytes;
  res.seconds = copy_seconds;
  res.gbps = copy_seconds > 0 ? bytes / copy_seconds / 1e9 : 0;
  return res;
}

}  // namespace ucpkit::gpu
#endif
