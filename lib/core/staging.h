// Staged output folders: a tool writes into a temporary folder beside its target and renames it into
// place at the end; on failure, and on SIGINT/SIGTERM, the folder is removed; a folder left by a
// SIGKILLed run is removed by the next run on the same target.
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace ucpkit {

// Marks this process as writing into a staging folder for its lifetime: SIGINT/SIGTERM then only set
// a flag (async-signal-safe), which check_interrupted() turns into an Error at the next job. Outside
// such a phase the signals keep their default action; a signal ignored at start (nohup) stays ignored.
class StagedPhase {
 public:
  StagedPhase();
  ~StagedPhase();
  StagedPhase(const StagedPhase&) = delete;
  StagedPhase& operator=(const StagedPhase&) = delete;
};

// Registers a folder to remove when a stop signal has to end the run by force (a thread blocked on a
// read that does not return within a grace time, UCPKIT_STOP_GRACE_MS, default 800 ms): staging
// folders and scratch copies register themselves for their lifetime; the normal unwinding removes
// them otherwise. Meaningful inside a StagedPhase (outside one the signals keep their default action).
class RemovedOnStop {
 public:
  explicit RemovedOnStop(std::filesystem::path path);
  ~RemovedOnStop();
  RemovedOnStop(const RemovedOnStop&) = delete;
  RemovedOnStop& operator=(const RemovedOnStop&) = delete;

 private:
  std::filesystem::path path_;
};

// A scratch folder this process owns at `path` (created by its user, or not at all): removed with everything in it when
// it goes out of scope (any exception included) and, being RemovedOnStop, when a stop signal ends the run by force.
// A folder a SIGKILLed run left is for sweep_stale_pid_folders (below) to remove.
class OwnedFolder {
 public:
  explicit OwnedFolder(std::filesystem::path path);
  ~OwnedFolder();
  OwnedFolder(const OwnedFolder&) = delete;
  OwnedFolder& operator=(const OwnedFolder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  RemovedOnStop removed_;
};

// Receives a line for the user (callers pass their Reporter::verbose; lib/core prints nothing itself).
using StagingNote = std::function<void(const std::string&)>;

// Flushes the file system holding `path` to stable storage (syncfs: one call for every file written
// there, instead of an fsync per file). Throws Error naming `path` when the flush fails.
void sync_file_system(const std::filesystem::path& path);

// What StagingDir's constructor refuses about `target`, checked alone (a tool that converts its input first calls it
// before that work): the target exists without `overwrite`, or with it is not a folder --overwrite may replace; its
// parent folder is missing. Throws Error naming the path.
void check_output_target(const std::filesystem::path& target, bool overwrite, const std::string& overwrite_option = "--overwrite");

// The folder `.<name>.<tag>-tmp-<pid>` beside `target` (created at construction, after sweeping stale
// ones, each reported to `note`; swept again at commit, for owners that died during this run),
// removed unless committed. `tag` names the tool family ("ucp":
// ucp-extract / ucp-union, "ucp-load"). An existing target is refused unless `overwrite`; commit()
// then swaps it out (atomically where the file system can exchange two names). `durable` (the
// default; tools' `--no-sync` turns it off for scratch outputs): commit() first flushes the file system
// of the folder, so the data is on stable storage before its name is, and fsyncs the parent folder after.
class StagingDir {
 public:
  // `overwrite_option`: the tool's option that allows replacing the target, named in refusals.
  StagingDir(const std::filesystem::path& target, bool overwrite, std::string tag, const StagingNote& note = {},
             bool durable = true, std::string overwrite_option = "--overwrite");
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // Makes the folder the target: flushes its file system (when durable), renames it into place and
  // fsyncs the parent folder. A SIGINT/SIGTERM that came before throws (nothing committed); one that
  // comes during the commit is forgotten once it succeeded (the output is complete: exit 0). Without `overwrite`, a target that appeared since the start (another run,
  // a user) is kept and commit() throws Error (rename without replacing); with it, the old target is
  // exchanged out and removed.
  void commit();
  // Flushes the folder's file system when durable (MPI ranks call it for their own files before the
  // barrier that precedes rank 0's commit: on a shared file system each client flushes its own data).
  void sync() const;

 private:
  StagedPhase phase_;  // first member: signals are flags before the folder is created
  std::filesystem::path target_, path_;
  std::string tag_, overwrite_option_;
  StagingNote note_;
  bool overwrite_ = false, durable_ = true;
  bool committed_ = false;
  std::unique_ptr<RemovedOnStop> removed_;  // the folder, while it is not committed
};

// Throws Error("interrupted by SIGINT|SIGTERM; ...") once such a signal arrived during a staged phase.
// Workers call it between jobs (files, parameters).
void check_interrupted();

// The signal (SIGINT/SIGTERM) that stopped a run while it wrote its staging folder, else 0. The run
// then throws after removing the folder; the tool's main re-raises the signal with its default action.
int interrupted_signal();

// For a tool's main, after the run: when interrupted_signal() is set, dies by that signal (default
// action, so the shell sees 128 + signal); returns otherwise.
void raise_if_interrupted();

// Test hook: with UCPKIT_TEST_PAUSE_STAGED=1, waits (staging folder written, not yet committed) until
// a signal arrives, so tests can kill a run at a known point; with UCPKIT_TEST_PAUSE_STAGED=<path>,
// waits until that file exists (or a signal arrives), so tests can act before the commit.
void test_pause_if_asked();
// Test hook: with UCPKIT_TEST_PAUSE_IN_COMMIT=<path>, StagingDir::commit writes <path>.reached after
// flushing the folder and waits (signals arriving meanwhile only set the flag) until <path> exists,
// then renames: tests signal a run during its final flush.
void test_pause_in_commit_if_asked();

// Removes `.<name>.<tag>-tmp-<pid>` folders beside `target` whose process is gone (left by SIGKILL or
// a crash; a zombie counts as gone); `.<name>.<tag>-old-<pid>` only when the target exists (else it is the only copy). Each
// removal is reported to `note`.
void sweep_stale_staging(const std::filesystem::path& target, const std::string& tag, const StagingNote& note = {});

// Why `target` (an existing output that --overwrite would replace) must be kept, or "" when it may go:
// it does not exist, it is an empty folder, or its top holds what a checkpoint or an output of these
// tools holds (manifest.json, latest, .metadata, global_step*, iter_*, *.safetensors, *.distcp, *.pt, ...).
// Anything else (a file, a folder of the user's files) is named: "holds no checkpoint (2 entries: a, b)".
std::string not_replaceable(const std::filesystem::path& target);
// The test "this top-level name belongs to a checkpoint or an output of these tools" that
// not_replaceable uses, registered by lib/formats (formats/looked_for.cpp) so that core names no
// format; until one is registered only an empty folder may be replaced.
void set_checkpoint_entry_test(bool (*test)(const std::string& name));

// Removes the entries of `dir` named `<prefix><pid>` or `<prefix><pid><non-digit>...` whose process is
// gone (scratch folders a SIGKILLed run left: ucp-load's universal copy, ucp-diff's temporary folder).
// Each removal is reported to `note`.
void sweep_stale_pid_folders(const std::filesystem::path& dir, const std::string& prefix, const StagingNote& note = {});

}  // namespace ucpkit
