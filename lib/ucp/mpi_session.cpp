// MPI session.
#include "ucp/mpi_session.h"

#include <mpi.h>

#include <cstdlib>

namespace ucpkit::ucp {

namespace {
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

MpiSession::~MpiSession() {
  if (active_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

void MpiSession::barrier() {
  if (active_) MPI_Barrier(MPI_COMM_WORLD);
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
  int in = flag ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return out != 0;
}

uint64_t MpiSession::sum(uint64_t v) {
  if (!active_) return v;
  uint64_t out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return out;
}

uint64_t MpiSession::max(uint64_t v) {
  if (!active_) return v;
  uint64_t out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

double MpiSession::max(double v) {
  if (!active_) return v;
  double out = 0;
  MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
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

}  // namespace ucpkit::ucp
