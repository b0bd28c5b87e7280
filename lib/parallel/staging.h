// An output folder that every MPI rank writes into (the step ucp-extract, ucp-union and
// ucp-load each spelled out): rank 0 creates the staging folder beside the target (core/staging) and
// prepares it, every rank learns its path, a failure on any rank ends every rank with the folder
// removed first, and rank 0 alone renames it into place.
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "core/staging.h"
#include "parallel/mpi_session.h"

namespace ucpkit::parallel {

class CollectiveStaging {
 public:
  // Collective: rank 0 creates the folder (StagingDir(target, overwrite, tag, note, durable,
  // overwrite_option)) and runs
  // `prepare` on its path (sub-folders); then every rank settles `failed` and receives the path.
  CollectiveStaging(RankFailure& failed, const std::filesystem::path& target, bool overwrite, const std::string& tag,
                    const StagingNote& note, bool durable,
                    const std::function<void(const std::filesystem::path&)>& prepare = {},
                    const std::string& overwrite_option = "--overwrite");
  CollectiveStaging(const CollectiveStaging&) = delete;
  CollectiveStaging& operator=(const CollectiveStaging&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // For RankFailure::settle: rank 0 removes the folder before any rank leaves.
  std::function<void()> cleanup() {
    return [this] { dir_.reset(); };
  }
  // Every rank but 0 flushes its own files (when durable; on a shared file system each client flushes
  // what it wrote); rank 0 flushes everything at commit. Call inside a guard.
  void sync_own_files() const;
  // Rank 0: renames the folder into place (StagingDir::commit); no-op elsewhere. Call inside a guard.
  void commit();
  // The end of a run that wrote into the folder (collective): every rank flushes its own files and
  // checks for a stop signal, then, once every rank got there, rank 0 renames the folder into place;
  // a failure on any rank ends every rank (`failed` settled after each step).
  void finish(RankFailure& failed);

 private:
  StagedPhase phase_;  // every rank: SIGINT/SIGTERM become a failure at the next job from here on
  std::unique_ptr<StagingDir> dir_;  // rank 0 only
  std::filesystem::path path_;
  bool durable_ = true;
  int rank_ = 0;
};

}  // namespace ucpkit::parallel
