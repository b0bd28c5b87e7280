// lib/parallel/mpi_session: what one process does with the session (no mpirun). MpiSession::get() is a
// process-wide singleton that initializes MPI at most once, so two kinds of process are tested:
//  * this one, started without a launcher's variables: an inactive session, every collective the
//    identity (MPI never initialized);
//  * a child (this same binary, the MpiSessionChild.* tests, which skip themselves in a normal run)
//    started with OMPI_COMM_WORLD_SIZE=1: MPI initialized as a one-rank singleton, the real collectives over one
//    rank, then finalize().
// RankFailure / collectively on one rank: the failure comes back as an Error with its own message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <unistd.h>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/mpi_session.h"
#include "support/process.h"

namespace mpi_session_test {

using namespace ucpkit;
using ucpkit::parallel::MpiSession;
using ucpkit::parallel::RankFailure;

namespace {

bool launcher_variables_set() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

// The collectives of a one-rank session, active or not, give back what this rank gave.
void expect_one_rank_identities(MpiSession& mpi) {
  EXPECT_EQ(mpi.rank(), 0);
  EXPECT_EQ(mpi.size(), 1);
  mpi.barrier();
  EXPECT_EQ(mpi.broadcast("hello"), "hello");
  EXPECT_EQ(mpi.broadcast(""), "");
  EXPECT_TRUE(mpi.any(true));
  EXPECT_FALSE(mpi.any(false));
  EXPECT_EQ(mpi.sum(uint64_t{1} << 40), uint64_t{1} << 40);
  EXPECT_EQ(mpi.max(uint64_t{7}), 7u);
  EXPECT_EQ(mpi.max(-2.5), -2.5);
  EXPECT_EQ(mpi.gather("g"), (std::vector<std::string>{"g"}));
  EXPECT_EQ(mpi.allgather({3, -4, 5}), (std::vector<std::vector<int64_t>>{{3, -4, 5}}));
  EXPECT_EQ(mpi.allgather({}), (std::vector<std::vector<int64_t>>{{}}));
  const std::vector<float> send{1.5f, -2.f, 3.f};
  std::vector<float> recv(3, 0.f);
  mpi.alltoallv(send.data(), {3}, recv.data(), {3});
  EXPECT_EQ(recv, send);
  std::vector<float> untouched{9.f};
  mpi.alltoallv(send.data(), {0}, untouched.data(), {0});
  EXPECT_EQ(untouched[0], 9.f);
}

}  // namespace

TEST(MpiSession, WithoutALauncherTheSessionIsInactive) {
  if (launcher_variables_set()) GTEST_SKIP() << "run under a launcher: this test is for a plain process";
  MpiSession& mpi = MpiSession::get();
  EXPECT_EQ(&mpi, &MpiSession::get());  // one per process
  EXPECT_FALSE(mpi.active());
  expect_one_rank_identities(mpi);
  mpi.finalize();  // no-op: MPI was never initialized
  mpi.finalize();
  EXPECT_FALSE(mpi.active());
}

TEST(MpiSession, InactiveAlltoallvNeedsItsOwnCount) {
  if (launcher_variables_set()) GTEST_SKIP();
  float f = 0;
  EXPECT_THROW(MpiSession::get().alltoallv(&f, {}, &f, {}), std::out_of_range);
}

TEST(MpiSession, ASingletonUnderALaunchersVariablesRunsRealCollectives) {
  if (launcher_variables_set()) GTEST_SKIP();
  // Open MPI starts a singleton (one rank) when MPI_Init is called outside mpirun.
  std::string out;
  const int rc = ucpkit::testing::run_command(
      "UCPKIT_MPI_SESSION_CHILD=1 OMPI_COMM_WORLD_SIZE=1 OMPI_ALLOW_RUN_AS_ROOT=1 "
      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 /proc/" +
          std::to_string(getpid()) + "/exe --gtest_filter=MpiSessionChild.ActiveOneRankSession",
      &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
}

// Runs only as the child above (it initializes MPI in its process).
TEST(MpiSessionChild, ActiveOneRankSession) {
  if (!std::getenv("UCPKIT_MPI_SESSION_CHILD"))
    GTEST_SKIP() << "run by MpiSession.ASingletonUnderALaunchersVariables...";
  MpiSession& mpi = MpiSession::get();
  ASSERT_TRUE(mpi.active());
  expect_one_rank_identities(mpi);
  parallel::RankFailure failed(mpi);
  failed.guard([] { throw Error("disk full"); });
  try {
    failed.settle();
    ADD_FAILURE() << "settle() returned";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "disk full");
  }
  mpi.finalize();
  mpi.finalize();  // a second call finds MPI finalized
}

TEST(RankFailure, NoFailureSettlesQuietly) {
  if (launcher_variables_set()) GTEST_SKIP();
  RankFailure failed(MpiSession::get());
  bool ran = false, cleaned = false;
  failed.guard([&] { ran = true; });
  EXPECT_NO_THROW(failed.settle([&] { cleaned = true; }));
  EXPECT_TRUE(ran);
  EXPECT_FALSE(cleaned);  // cleanup only runs when some rank failed
}

TEST(RankFailure, OneRanksFailureComesBackWithItsOwnMessageAfterCleanup) {
  if (launcher_variables_set()) GTEST_SKIP();
  RankFailure failed(MpiSession::get());
  bool cleaned = false;
  failed.guard([] { throw Error("x.pt: truncated"); });
  failed.guard([] { throw Error("second failure: not kept"); });
  try {
    failed.settle([&] {
      cleaned = true;
      throw Error("cleanup errors are swallowed");
    });
    ADD_FAILURE() << "settle() returned";
  } catch (const ReportedElsewhere&) {
    ADD_FAILURE() << "rank 0 reports the failure itself";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "x.pt: truncated");  // rank 0 alone failed: no rank named
  }
  EXPECT_TRUE(cleaned);
}

TEST(RankFailure, UsageErrorsPassThroughAndEmptyMessagesAreNamed) {
  if (launcher_variables_set()) GTEST_SKIP();
  RankFailure failed(MpiSession::get());
  EXPECT_THROW(failed.guard([] { throw UsageError("--batch-mb must be positive"); }), UsageError);
  failed.guard([] { throw std::runtime_error(""); });
  try {
    failed.settle("never used on one rank");
    ADD_FAILURE() << "settle() returned";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown error");
  }
}

TEST(RankFailure, CollectivelyRunsTheStepAndRaisesItsFailure) {
  if (launcher_variables_set()) GTEST_SKIP();
  int steps = 0;
  parallel::collectively(MpiSession::get(), [&] { ++steps; });
  EXPECT_EQ(steps, 1);
  try {
    parallel::collectively(MpiSession::get(), [] { throw std::length_error("batch too large"); });
    ADD_FAILURE() << "collectively() returned";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "batch too large");
  }
}

TEST(MpiSession, DieIfInterruptedReturnsWhenNoSignalCame) {
  if (launcher_variables_set()) GTEST_SKIP();
  parallel::die_if_interrupted();
  SUCCEED();
}

}  // namespace mpi_session_test
