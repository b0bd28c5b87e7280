// GPU path: one target rank's ZeRO partition materialized in device memory, DP-group members
// reading disjoint shares and exchanging the replicated low-precision weights over NCCL. Built only
// into the GPU module libucpkit_gpu.so (the only binary linking libcudart and libnccl), which
// libucpkit loads on --device cuda (gpu/device_load.cpp, entry points in gpu/module_abi.h).
#include "gpu/device_load.h"
#include "gpu/module_abi.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <algorithm>
#include <cstring>
#include <span>
#include <filesystem>
#include <vector>

#include <tbb/parallel_for.h>

#include "core/crc32.h"
#include "core/error.h"
#include "io/torch/torch_file.h"
#include "reshard/deepspeed_writer.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"
#include "reshard/universal_reader.h"
#include "parallel/mpi_session.h"
#include "parallel/threads.h"

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

bool device_usable(std::string* why) {
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

namespace {

reshard::TargetLayout target_of(const DeviceLoadRequest& req) {
  reshard::TargetLayout t;
  t.tp = req.tp;
  t.pp = req.pp;
  t.dp = req.dp;
  t.zero_stage = req.zero_stage;
  t.dtype = DType::BFloat16;
  t.bf16_optimizer = req.zero_stage == 0;
  return t;
}

// The NCCL communicator of a DP group spread over the MPI ranks (rank `me` of `size`).
ncclComm_t nccl_group(parallel::MpiSession& mpi, int size, int me) {
  ncclUniqueId id;
  std::string s;
  if (mpi.rank() == 0) {
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    s.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  s = mpi.broadcast(s);
  std::memcpy(&id, s.data(), sizeof id);
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, size, id, me), "ncclCommInitRank");
  return comm;
}

// Checksums of the atomic tensors (each of `members` DP members a disjoint share), all cores at once.
void verify_share(const reshard::ModelInfo& model, reshard::UniversalReader& reader, int members, int me) {
  std::vector<std::pair<int, std::string>> jobs;
  for (size_t i = 0; i < model.params.size(); ++i)
    if (static_cast<int>(i % members) == me)
      for (const auto& st : model.states) jobs.emplace_back(static_cast<int>(i), st);
  tbb::parallel_for(size_t{0}, jobs.size(), [&](size_t k) { reader.check(jobs[k].first, jobs[k].second); });
}

constexpr size_t kChunk = size_t{64} << 20, kPiece = size_t{2} << 20;

// Host -> device staging: each partition is produced chunk by chunk into one of two reused pinned
// buffers (all cores fill a chunk in 2 MiB pieces, CRC-32 on the way) while the other chunk's DMA runs.
class ChunkStager {
 public:
  explicit ChunkStager(cudaStream_t stream) : stream_(stream), ring0_(kChunk), ring1_(kChunk) {
    ring_[0] = static_cast<uint8_t*>(ring0_.p);
    ring_[1] = static_cast<uint8_t*>(ring1_.p);
    for (auto& e : free_ev_) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~ChunkStager() {
    for (auto& [b, e] : dma_) {
      cudaEventDestroy(b);
      cudaEventDestroy(e);
    }
    for (auto& e : free_ev_) cudaEventDestroy(e);
  }
  ChunkStager(const ChunkStager&) = delete;
  ChunkStager& operator=(const ChunkStager&) = delete;

  // Copies `part`'s bytes to `dst` on the device; returns their CRC-32.
  uint32_t stage(const Tensor& part, uint8_t* dst) {
    const Storage& st = *part.storage();
    const uint64_t total = st.nbytes();
    uint32_t crc = 0;
    for (uint64_t off = 0; off < total; off += kChunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, total - off));
      cuda_check(cudaEventSynchronize(free_ev_[slot_]), "cudaEventSynchronize");
      const size_t pieces = (n + kPiece - 1) / kPiece;
      std::vector<uint32_t> crcs(pieces);
      tbb::parallel_for(size_t{0}, pieces, [&](size_t k) {
        const size_t a = k * kPiece, len = std::min(kPiece, n - a);
        std::span<uint8_t> out(ring_[slot_] + a, len);
        st.generate(off + a, out);
        crcs[k] = crc32_update(0, out);
      });
      for (size_t k = 0; k < pieces; ++k) crc = crc32_combine(crc, crcs[k], std::min(kPiece, n - k * kPiece));
      cudaEvent_t b, e;
      cuda_check(cudaEventCreate(&b), "cudaEventCreate");
      cuda_check(cudaEventCreate(&e), "cudaEventCreate");
      cuda_check(cudaEventRecord(b, stream_), "cudaEventRecord");
      cuda_check(cudaMemcpyAsync(dst + off, ring_[slot_], n, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
      cuda_check(cudaEventRecord(e, stream_), "cudaEventRecord");
      cuda_check(cudaEventRecord(free_ev_[slot_], stream_), "cudaEventRecord");
      dma_.emplace_back(b, e);
      slot_ ^= 1;
    }
    return crc;
  }

  // Seconds the DMAs took (events around each copy); call after the stream is synchronized.
  double copy_seconds() const {
    double s = 0;
    for (const auto& [b, e] : dma_) {
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, b, e), "cudaEventElapsedTime");
      s += ms / 1e3;
    }
    return s;
  }

  // A pinned chunk-sized buffer for other uses once staging is over.
  uint8_t* scratch() const { return ring_[0]; }

 private:
  cudaStream_t stream_;
  Pinned ring0_, ring1_;
  uint8_t* ring_[2];
  cudaEvent_t free_ev_[2];
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> dma_;  // timing events around each DMA
  int slot_ = 0;
};

// Low-precision weights are replicated over DP: each member converts its share of group `g` to bf16,
// NCCL all-gathers the whole. Returns the device buffer; adds its bytes to `bytes`.
std::unique_ptr<DeviceBuf> gather_low_precision(reshard::DeepSpeedWriter& writer, const reshard::GroupPlan& g, int me,
                                                int members, ncclComm_t comm, cudaStream_t stream, uint64_t& bytes) {
  const Tensor host = writer.partition_tensor(g, me, "fp32");
  const size_t lp_part = static_cast<size_t>(g.partition) * 2;
  Pinned pin(lp_part);
  reshard::convert_from_fp32(reinterpret_cast<const float*>(host.contiguous_bytes().data()),
                          static_cast<size_t>(g.partition), DType::BFloat16, static_cast<uint8_t*>(pin.p));
  auto full = std::make_unique<DeviceBuf>(lp_part * members);
  uint8_t* mine = static_cast<uint8_t*>(full->p) + lp_part * me;
  cuda_check(cudaMemcpyAsync(mine, pin.p, lp_part, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  nccl_check(ncclAllGather(mine, full->p, static_cast<size_t>(g.partition), ncclBfloat16, comm, stream),
             "ncclAllGather");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  bytes += lp_part;
  return full;
}

// What is on the device, read back through `scratch` (pinned, kChunk bytes) and checksummed: these
// are the CRCs reported, so a test compares device memory itself with the CPU path's files.
std::vector<uint32_t> read_back_crcs(const std::vector<std::pair<void*, uint64_t>>& placed,
                                     const std::vector<uint32_t>& host_crc, uint8_t* scratch) {
  std::vector<uint32_t> out;
  for (size_t k = 0; k < placed.size(); ++k) {
    uint32_t crc = 0;
    for (uint64_t off = 0; off < placed[k].second; off += kChunk) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, placed[k].second - off));
      cuda_check(cudaMemcpy(scratch, static_cast<uint8_t*>(placed[k].first) + off, n, cudaMemcpyDeviceToHost),
                 "cudaMemcpy back");
      crc = crc32_combine(crc, crc32_parallel({scratch, n}), n);
    }
    if (crc != host_crc[k]) throw Error("device copy differs from the host partition (CRC-32 after read-back)");
    out.push_back(crc);
  }
  return out;
}

// Baseline in the same run: one plain pinned cudaMemcpy of `bytes`, in GB/s.
double baseline_gbps(uint64_t bytes) {
  Pinned pin(bytes);
  std::memset(pin.p, 1, bytes);
  DeviceBuf dev(bytes);
  const auto tb = Clock::now();
  cuda_check(cudaMemcpy(dev.p, pin.p, bytes, cudaMemcpyHostToDevice), "baseline cudaMemcpy");
  const double s = since(tb);
  return s > 0 ? bytes / s / 1e9 : 0;
}

}  // namespace

DeviceLoadResult load_partition(const DeviceLoadRequest& req) {
  const auto t_start = Clock::now();
  std::string why;
  if (!device_usable(&why)) throw Error("no GPU: " + why);
  auto& mpi = parallel::MpiSession::get();
  reshard::ModelInfo model = reshard::read_model_info(req.universal_dir);
  const reshard::UcpInfo plan = reshard::ucp_info(model, target_of(req));
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
  ncclComm_t comm = group ? nccl_group(mpi, req.dp, me) : nullptr;
  cudaStream_t stream;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
  reshard::UniversalReader reader(model, req.universal_dir, req.verify);
  reshard::DeepSpeedWriter writer(model, plan, reader, model.optimizer_state);  // its only user
  const int threads = parallel::thread_count(0);
  res.phase_seconds["setup"] = since(t_start);

  auto t0 = Clock::now();
  if (req.verify) verify_share(model, reader, group ? req.dp : 1, group ? me : 0);
  res.phase_seconds["verify"] = since(t0);

  t0 = Clock::now();
  uint64_t bytes = 0;
  std::vector<std::pair<void*, uint64_t>> placed;  // device partitions, for the check below
  std::vector<std::unique_ptr<DeviceBuf>> keep;
  std::vector<uint32_t> host_crc;
  ChunkStager stager(stream);
  for (size_t gi = 0; gi < mr.groups.size(); ++gi) {
    const auto& g = mr.groups[gi];
    // fp32 master partition and optimizer states: this rank's own share, read by this rank only.
    for (const auto& state : model.states) {
      const Tensor part = writer.partition_tensor(g, me, state, -1, /*stream=*/true);
      auto dev = std::make_unique<DeviceBuf>(part.nbytes());
      host_crc.push_back(stager.stage(part, static_cast<uint8_t*>(dev->p)));
      bytes += part.storage()->nbytes();
      placed.emplace_back(dev->p, part.nbytes());
      keep.push_back(std::move(dev));
    }
    if (group) keep.push_back(gather_low_precision(writer, g, me, req.dp, comm, stream, bytes));
  }
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  res.phase_seconds["stage"] = since(t0);
  const double copy_seconds = stager.copy_seconds();
  res.end_to_end_seconds = since(t_start);

  t0 = Clock::now();  // not part of the timings above
  res.partition_crc32 = read_back_crcs(placed, host_crc, stager.scratch());
  res.phase_seconds["device_check"] = since(t0);
  res.threads = threads;
  res.baseline_gbps = baseline_gbps(bytes);
  cudaStreamDestroy(stream);
  if (comm) ncclCommDestroy(comm);
  res.bytes_to_device = bytes;
  res.seconds = copy_seconds;
  res.gbps = copy_seconds > 0 ? bytes / copy_seconds / 1e9 : 0;
  res.end_to_end_gbps = res.end_to_end_seconds > 0 ? bytes / res.end_to_end_seconds / 1e9 : 0;
  return res;
}

}  // namespace ucpkit::gpu

extern "C" {
int ucpkit_gpu_module_abi() { return UCPKIT_GPU_MODULE_ABI; }
bool ucpkit_gpu_available(std::string* why) { return ucpkit::gpu::device_usable(why); }
void ucpkit_gpu_load_partition(const ucpkit::gpu::DeviceLoadRequest& request,
                               ucpkit::gpu::DeviceLoadResult& result) {
  result = ucpkit::gpu::load_partition(request);
}
}
