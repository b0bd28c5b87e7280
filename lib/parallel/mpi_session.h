// MPI when the tool runs under mpirun (one process otherwise): rank, size and the few collectives
// the conversion needs. MPI is initialized lazily and only when a launcher is detected.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"

namespace ucpkit::parallel {

class MpiSession {
 public:
  // The process-wide session (initializes MPI on first use when launched by mpirun/srun).
  static MpiSession& get();
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool active() const { return active_; }

  void barrier();
  // Ends MPI now (no-op when not active or already ended). MPI_Finalize waits for every rank, so a
  // rank about to die by a signal calls it first: the launcher, seeing one rank killed, would
  // otherwise SIGKILL the others while rank 0 still removes its staging folder.
  void finalize();
  std::string broadcast(const std::string& s, int root = 0);
  bool any(bool flag);                      // logical OR over ranks
  uint64_t sum(uint64_t v);
  uint64_t max(uint64_t v);
  double max(double v);
  std::vector<std::string> gather(const std::string& s, int root = 0);  // on root: one per rank
  std::vector<std::vector<int64_t>> allgather(const std::vector<int64_t>& v);  // one per rank
  // Personalized all-to-all: `send` holds send_counts[r] floats for each rank r back to back; `recv`
  // gets recv_counts[r] floats from each rank r back to back (counts must be known on both sides;
  // the caller's buffers, so that a loop of exchanges reuses the same memory).
  void alltoallv(const float* send, const std::vector<uint64_t>& send_counts, float* recv,
                 const std::vector<uint64_t>& recv_counts);

 private:
  MpiSession();
  ~MpiSession();
  int rank_ = 0, size_ = 1;
  bool active_ = false;
};

// Runs work on this rank keeping the first failure's message (usage errors go through: every rank
// makes the same ones); settle() then raises it on every MPI rank: on rank 0 as Error with the lowest
// failing rank's message (naming that rank when it is not 0; `what` when none has one), on the others
// as ReportedElsewhere (tools exit 1 without printing it, so the user reads one line). A
// collective: every rank calls settle() at the same point, so no rank is left waiting in the next
// collective while another has failed.
class RankFailure {
 public:
  explicit RankFailure(MpiSession& mpi) : mpi_(mpi) {}
  template <class F>
  void guard(F&& f) {
    try {
      f();
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception& e) {
      if (failure_.empty()) failure_ = *e.what() ? e.what() : "unknown error";
    }
  }
  // `cleanup` (rank 0 removing its staging folder) runs before any rank leaves, so a rank that exits
  // first cannot get the job killed while the folder is still there.
  void settle(const char* what = "another MPI rank failed", const std::function<void()>& cleanup = {});
  void settle(const std::function<void()>& cleanup) { settle("another MPI rank failed", cleanup); }

 private:
  MpiSession& mpi_;
  std::string failure_;
};

// One step all ranks take together: `f` under a RankFailure, then settle().
template <class F>
void collectively(MpiSession& mpi, F&& f) {
  RankFailure failed(mpi);
  failed.guard(std::forward<F>(f));
  failed.settle();
}

// For a tool's main after its run: when SIGINT/SIGTERM stopped it (staging folder removed), ends MPI
// together with the other ranks, then dies by that signal; returns otherwise.
void die_if_interrupted();

}  // namespace ucpkit::parallel
