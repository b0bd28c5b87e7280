// moe-replace's run: plan, then every output written all or nothing.
#include "tool/moe_replace.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "tool/dry_run.h"
#include "tool/tool.h"

namespace ucpkit::tool {
namespace {

using NamedPath = std::pair<const char*, std::string>;  // option, path ("" when not given)

// A written file never replaces an input (--loads, --current, --previous) or another written file
// (the SGLang / vLLM outputs could overwrite --loads or the plan); `written[0]` is --output,
// which may name the --current / --previous plan it updates (written whole through a temporary file
// after the plan was read).
void refuse_same_paths(const std::vector<NamedPath>& written, const std::vector<NamedPath>& read) {
  auto same = [](const std::string& a, const std::string& b) { return path_within(a, b) && path_within(b, a); };
  for (size_t i = 0; i < written.size(); ++i) {
    const auto& [w_opt, w] = written[i];
    if (w.empty()) continue;
    for (const auto& [r_opt, r] : read)
      if (!r.empty() && same(w, r) && !(i == 0 && std::string(r_opt) != "--loads"))  // the plan updated in place
        throw UsageError(std::string(w_opt) + " " + w + " is " + r_opt + " " + r + ": writing it would replace the input");
    for (size_t j = 0; j < i; ++j)
      if (!written[j].second.empty() && same(w, written[j].second))
        throw UsageError(std::string(w_opt) + " " + w + " is " + written[j].first + " " + written[j].second +
                         (std::string(written[j].first) == "--output" ? ": writing it would replace the plan"
                                                                      : ": two outputs into one file"));
  }
}

// SIGINT/SIGTERM while the outputs are written (a 200 MB plan's temporary file was left
// behind): while a StopSignals lives they only set a flag; dispositions are restored after it, and
// a signal ignored at the start (nohup) stays ignored.
std::atomic<int> g_stop{0};
extern "C" void moe_replace_on_stop(int sig) { g_stop.store(sig); }

class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = moe_replace_on_stop;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int i = 0; i < 2; ++i) {
      installed_[i] = ::sigaction(kSignals[i], nullptr, &old_[i]) == 0 && old_[i].sa_handler != SIG_IGN &&
                      ::sigaction(kSignals[i], &sa, nullptr) == 0;
    }
  }
  ~StopSignals() {
    for (int i = 0; i < 2; ++i)
      if (installed_[i]) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr int kSignals[2] = {SIGINT, SIGTERM};
  struct sigaction old_[2] {};
  bool installed_[2] = {false, false};
};

// Test hook: with UCPKIT_TEST_PAUSE_MOE_WRITE=<path>, once every output is staged (temporary files
// written, nothing renamed), creates <path> and waits for a signal (or 30 s), so a test can send one
// at a known point.
void test_pause_staged() {
  const char* v = std::getenv("UCPKIT_TEST_PAUSE_MOE_WRITE");
  if (!v || !*v) return;
  { AtomicFile marker(v); marker.commit(); }
  for (int i = 0; i < 3000 && g_stop.load() == 0; ++i) ::usleep(10000);
}

// Every output's folder is checked and every output staged in its temporary file before the first is
// renamed into place: a failure before that leaves none of them. A SIGINT/SIGTERM that comes before
// the first rename removes the temporary files and then ends the run by that signal (the shell sees
// 130/143, nothing written); one that comes during the renames (each fsyncs its file first) lets
// them finish: everything is written and the run ends as it would have (exit 0).
// `first_stream`, when set, writes the first file in pieces instead of its bytes (a re-placement's
// plan, hundreds of MB at 1,024 nodes: placement::PlanOutcome::write_plan_file).
void write_all(const std::vector<std::pair<std::string, std::string_view>>& files,
               const std::function<void(const placement::TextSink&)>& first_stream = {}) {
  for (const auto& [path, bytes] : files)
    if (!path.empty()) check_file_target(path);
  int stopped = 0;
  {
    StopSignals stop;
    {
      std::vector<std::unique_ptr<AtomicFile>> staged;
      for (size_t i = 0; i < files.size(); ++i) {
        const auto& [path, bytes] = files[i];
        if (path.empty() || g_stop.load()) continue;
        // The streamed plan bypasses the page cache (AtomicFile::Cache::bypass: hundreds of MB that
        // cost the kernel more CPU to cache than the plan took to compute).
        const bool streamed = i == 0 && static_cast<bool>(first_stream);
        staged.push_back(std::make_unique<AtomicFile>(path, /*durable=*/true,
                                                      streamed ? AtomicFile::Cache::bypass : AtomicFile::Cache::keep));
        if (streamed)
          first_stream([&](std::string_view piece) { staged.back()->write(piece.data(), piece.size()); });
        else
          staged.back()->write(bytes.data(), bytes.size());
        staged.back()->start_writeback();
      }
      test_pause_staged();
      stopped = g_stop.load();
      if (!stopped)
        for (auto& f : staged) f->commit();
    }  // uncommitted temporary files are removed here
  }    // the signals' dispositions are back
  if (stopped) {
    ::raise(stopped);  // default action: the run ends by the signal, nothing written
    throw Error(std::string("interrupted by ") + (stopped == SIGINT ? "SIGINT" : "SIGTERM") + "; nothing was written");
  }
  g_stop.store(0);  // a signal during the renames: everything is written, the run ends normally
}

// Temporary files `<output>.tmp.<pid>.<n>` (AtomicFile's names) beside each output whose process is
// gone (no such pid on this host) and that were last modified a minute ago or earlier (a writer on
// another host of a shared file system is not visible to kill(2); one minute without a write is more
// than a live run's staging takes): left by a run that was killed (SIGKILL, power loss). Removed,
// each named on stderr.
void sweep_stale_temporaries(const std::vector<std::string>& outputs) {
  for (const auto& out : outputs) {
    if (out.empty()) continue;
    const std::filesystem::path target(out);
    std::filesystem::path dir = target.parent_path();
    if (dir.empty()) dir = ".";
    const std::string prefix = target.filename().string() + ".tmp.";
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string rest = name.substr(prefix.size());
      const size_t dot = rest.find('.');
      if (dot == std::string::npos || dot == 0 || dot + 1 == rest.size() ||
          rest.find_first_not_of("0123456789.") != std::string::npos || rest.find('.', dot + 1) != std::string::npos)
        continue;
      const long pid = std::strtol(rest.substr(0, dot).c_str(), nullptr, 10);
      if (pid <= 0 || pid == ::getpid() || !(::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) continue;
      struct stat st {};
      if (::lstat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || std::time(nullptr) - st.st_mtime < 60)
        continue;
      std::error_code rm;
      if (std::filesystem::remove(entry.path(), rm))
        info("removed " + entry.path().string() + ", a temporary file left by process " + std::to_string(pid) +
             " (no longer running)");
    }
  }
}

}  // namespace

void MoeReplaceOptions::check() {
  refuse_same_paths({{"--output", output}, {"--svg", svg}, {"--sglang-expert-location", sglang_out}, {"--vllm-eplb-state", vllm_out}},
                    {{"--loads", req.loads_path}, {"--current", req.current_path}, {"--previous", req.previous_path}});
  if (req.placement.recovery.max_failures < 0) throw UsageError("--max-failures must not be negative");
  if (!failed.empty()) req.change.failed = placement::parse_id_list(failed, "--failed-nodes");
  req.change.added = added;
  req.placement.recovery.exact_limit = exact_limit;
  if (expert_bytes_given) req.expert_bytes = static_cast<double>(expert_bytes);
  if (max_moved_given) req.max_moved_bytes = static_cast<double>(max_moved_bytes);
  req.node_loss_migration = current_given && (weight_given || max_moved_given);
  req.want_svg = !svg.empty();
  req.want_sglang = !sglang_out.empty();
  req.want_vllm = !vllm_out.empty();
  if (!layers_map.empty()) req.layers_map = placement::parse_layers_map(layers_map);
  if (!min_recovery.empty()) req.min_recovery = placement::parse_min_recovery(min_recovery);
  if (pp_size != 0 || !pp_partition.empty()) {
    if (!req.layers_map)
      throw UsageError("--pp-size and --pp-layer-partition need --layers-map (the stages split its decoder layers)");
    const std::vector<int> sizes =
        pp_partition.empty() ? std::vector<int>{} : placement::parse_pp_partition(pp_partition);
    req.pp_stages = placement::pp_stages(*req.layers_map, pp_size != 0 ? pp_size : static_cast<int>(sizes.size()), sizes);
  }
}

Result run_moe_replace(const MoeReplaceOptions& o) {
  if (!o.dry_run) sweep_stale_temporaries({o.output, o.svg, o.sglang_out, o.vllm_out});
  placement::PlanOutcome out = placement::make_plan(o.req);
  if (!out.said.empty()) info(out.said);
  for (const auto& note : out.notes) warn(note);
  if (out.migration && !out.migration->lost.empty())
    warn(std::to_string(out.migration->lost.size()) + " experts have no surviving replica");
  const std::vector<std::pair<std::string, std::string_view>> files = {
      {o.output, {}}, {o.svg, out.svg}, {o.sglang_out, out.sglang_text}, {o.vllm_out, out.vllm_bytes}};
  if (o.dry_run) {
    std::vector<std::string> names;
    for (const auto& f : files)
      if (!f.first.empty()) names.push_back(f.first);
    Result r = dry_run_result(replace_dry_run(out.summary, names));
    r.text = out.table + r.text;
    return r;
  }
  write_all(files, [&](const placement::TextSink& sink) { out.write_plan_file(sink); });
  Result r;
  r.output = o.output;
  r.fields = out.summary;
  r.fields["output"] = o.output;
  if (!o.svg.empty()) r.fields["svg"] = o.svg;
  if (!o.sglang_out.empty()) r.fields["sglang_expert_location"] = o.sglang_out;
  if (!o.vllm_out.empty()) r.fields["vllm_eplb_state"] = o.vllm_out;
  r.fields["peak_rss_bytes"] = peak_rss_bytes();
  if (verbosity() >= 0) r.text = out.table;
  if (verbosity() >= 1) r.notes.push_back("wrote " + o.output + " in " + std::to_string(out.seconds) + " s");
  return r;
}

}  // namespace ucpkit::tool
