#include "parallel/staging.h"

#include "core/mapped_file.h"

namespace ucpkit::parallel {

CollectiveStaging::CollectiveStaging(RankFailure& failed, const std::filesystem::path& target, bool overwrite,
                                     const std::string& tag, const StagingNote& note, bool durable,
                                     const std::function<void(const std::filesystem::path&)>& prepare,
                                     const std::string& overwrite_option)
    : durable_(durable) {
  auto& mpi = MpiSession::get();
  rank_ = mpi.rank();
  std::string staged;
  failed.guard([&] {
    if (rank_ != 0) return;
    dir_ = std::make_unique<StagingDir>(target, overwrite, tag, note, durable, overwrite_option);
    if (prepare) prepare(dir_->path());
    staged = dir_->path().string();
  });
  failed.settle(cleanup());
  path_ = mpi.broadcast(staged);
}

void CollectiveStaging::sync_own_files() const {
  MappedFile::check_inputs_intact();  // on every rank, inside the caller's guard: one rank's shrunken input fails all
  if (rank_ != 0 && durable_) sync_file_system(path_);
}

void CollectiveStaging::finish(RankFailure& failed) {
  failed.guard([&] {
    if (rank_ == 0) test_pause_if_asked();  // output written, not yet renamed into place
    sync_own_files();
    check_interrupted();
  });
  failed.settle();
  MpiSession::get().barrier();
  failed.guard([&] { commit(); });
  failed.settle();
}

void CollectiveStaging::commit() {
  if (dir_) dir_->commit();
}

}  // namespace ucpkit::parallel
