// MPI session.
#include "parallel/mpi_session.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "core/staging.h"

namespace ucpkit::parallel {

namespace {
// Completes a non-blocking collective without spinning a core: MPI_Test, then sleeps that grow from
// 20 us to 1 ms. Blocking MPI calls busy-poll (Open MPI's opal_progress / shared-memory BTL), so a
// rank that reaches a synchronization point early took a core from the ranks still working: with
// 2 ranks on 2 cores, 34% of all CPU samples of a ucp-load exchange were MPI polling. Used for the
// small collectives where ranks wait for each other; bulk transfers stay blocking (they progress
// only inside MPI calls).
void polite_wait(MPI_Request& request) {
  long us = 20;
  for (;;) {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    us = std::min(us * 2, 1000L);
  }
}

template <class T>
T allreduce(T v, MPI_Datatype type, MPI_Op op) {
  T out{};
  MPI_Request r;
  MPI_Iallreduce(&v, &out, 1, type, op, MPI_COMM_WORLD, &r);
  polite_wait(r);
  return out;
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}
}  // namespace

MpiSession& MpiSession::get() {
  static MpiSession s;
  return s;
}

MpiSession::MpiSession() {
  if (!launched_by_mpi()) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  active_ = true;
}

MpiSession::~MpiSession() { finalize(); }

void MpiSession::finalize() {
  if (!active_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiSession::barrier() {
  if (!active_) return;
  MPI_Request r;
  MPI_Ibarrier(MPI_COMM_WORLD, &r);
  polite_wait(r);
}

std::string MpiSession::broadcast(const std::string& s, int root) {
  if (!active_) return s;
  uint64_t n = s.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
  std::string out = rank_ == root ? s : std::string(n, '\0');
  MPI_Bcast(out.data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD);
  return out;
}

bool MpiSession::any(bool flag) {
  if (!active_) return flag;
  return allreduce<int>(flag ? 1 : 0, MPI_INT, MPI_MAX) != 0;
}

uint64_t MpiSession::sum(uint64_t v) {
  if (!active_) return v;
  return allreduce<uint64_t>(v, MPI_UINT64_T, MPI_SUM);
}

uint64_t MpiSession::max(uint64_t v) {
  if (!active_) return v;
  return allreduce<uint64_t>(v, MPI_UINT64_T, MPI_MAX);
}

double MpiSession::max(double v) {
  if (!active_) return v;
  return allreduce<double>(v, MPI_DOUBLE, MPI_MAX);
}

std::vector<std::string> MpiSession::gather(const std::string& s, int root) {
  if (!active_) return {s};
  int n = static_cast<int>(s.size());
  std::vector<int> sizes(size_), displs(size_);
  MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, MPI_COMM_WORLD);
  std::string all;
  if (rank_ == root) {
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = total;
      total += sizes[r];
    }
    all.resize(total);
  }
  MPI_Gatherv(s.data(), n, MPI_CHAR, all.data(), sizes.data(), displs.data(), MPI_CHAR, root, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank_ == root)
    for (int r = 0; r < size_; ++r) out.push_back(all.substr(displs[r], sizes[r]));
  return out;
}

std::vector<std::vector<int64_t>> MpiSession::allgather(const std::vector<int64_t>& v) {
  if (!active_) return {v};
  if (v.size() > static_cast<size_t>(INT32_MAX)) throw std::length_error("allgather: more than 2^31 values");
  int n = static_cast<int>(v.size());
  std::vector<int> sizes(size_), displs(size_);
  MPI_Allgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    if (total > INT32_MAX) throw std::length_error("allgather: more than 2^31 values in all");
    displs[r] = static_cast<int>(total);
    total += sizes[r];
  }
  std::vector<int64_t> all(static_cast<size_t>(total));
  MPI_Allgatherv(v.data(), n, MPI_INT64_T, all.data(), sizes.data(), displs.data(), MPI_INT64_T, MPI_COMM_WORLD);
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < size_; ++r) out.emplace_back(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
  return out;
}

void MpiSession::alltoallv(const float* send, const std::vector<uint64_t>& send_counts, float* recv,
                           const std::vector<uint64_t>& recv_counts) {
  if (!active_) {
    if (send_counts.at(0) > 0) std::memcpy(recv, send, send_counts[0] * sizeof(float));
    return;
  }
  // Counts and displacements are ints in MPI: 2^31 floats (8 GiB) per pair and in all per rank.
  auto ints = [](const std::vector<uint64_t>& counts, std::vector<int>& c, std::vector<int>& d) {
    uint64_t at = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      if (counts[r] > INT32_MAX || at > INT32_MAX)
        throw std::length_error("MPI exchange batch too large (more than 2^31 floats for one rank); lower --batch-mb");
      c[r] = static_cast<int>(counts[r]);
      d[r] = static_cast<int>(at);
      at += counts[r];
    }
  };
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  ints(send_counts, sc, sd);
  ints(recv_counts, rc, rd);
  MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT, MPI_COMM_WORLD);
}

void RankFailure::settle(const char* what, const std::function<void()>& cleanup) {
  if (!mpi_.any(!failure_.empty())) return;
  if (cleanup) {
    try {
      cleanup();
    } catch (const std::exception&) {
    }
  }
  // Rank 0 reports the failure of the lowest failing rank, naming it; the other ranks exit 1 quietly
  // (each rank printing its own line gave interleaved, repeated lines, and "another MPI rank failed"
  // from rank 0 without the reason).
  const auto all = mpi_.gather(failure_);
  mpi_.barrier();
  if (mpi_.rank() != 0) throw ReportedElsewhere(failure_.empty() ? std::string(what) : failure_);
  int first = -1, count = 0;
  for (int r = 0; r < static_cast<int>(all.size()); ++r)
    if (!all[r].empty()) {
      if (first < 0) first = r;
      ++count;
    }
  if (first < 0) throw Error(what);
  std::string msg = all[first];
  if (first != 0 || count > 1) {
    msg += " (MPI rank " + std::to_string(first);
    if (count > 1) msg += "; " + std::to_string(count) + " of " + std::to_string(mpi_.size()) + " ranks failed";
    msg += ")";
  }
  throw Error(msg);
}

void die_if_interrupted() {
  if (!interrupted_signal()) return;
  MpiSession::get().finalize();
  raise_if_interrupted();
}

}  // namespace ucpkit::parallel
