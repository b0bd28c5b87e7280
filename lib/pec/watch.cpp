// The persist agent loop.
#include "pec/watch.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "pec/paths.h"
#include "pec/step_sources.h"
#include "pec/store.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

void prune_snapshots(const std::string& dir, int keep, int64_t newest_saved) {
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (auto s = step_of_tag(e.path().filename().string()); s && e.is_directory()) steps.emplace_back(*s, e.path());
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < steps.size(); ++i)
    if (steps[i].first < newest_saved) fs::remove_all(steps[i].second, ec);
}
}  // namespace

WatchResult watch_and_save(const SaveOptions& base, const WatchOptions& options,
                           const std::function<void(const std::string&)>& log) {
  WatchOptions w = options;
  w.dir = absolute_path(w.dir);
  if (!fs::is_directory(w.dir)) fail(w.dir, "folder to watch not found");
  if (w.poll_seconds <= 0) throw UsageError("--poll-seconds must be > 0");
  if (w.keep_snapshots < 0) throw UsageError("--keep-snapshots must be >= 0");
  check_save_options(base);  // usage errors before the store is created
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_term {}, old_int {};
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGINT, &sa, &old_int);
  g_stop = 0;
  int64_t last = -1;  // newest step saved or attempted
  {
    Store durable(absolute_path(base.store), Tier::durable, StoreOpen::create);
    if (auto s = durable.latest_step()) last = *s;
  }
  WatchResult result;
  while (!g_stop) {
    auto step = formats::deepspeed::completed_step(w.dir);
    if (step && *step > last) {
      SaveOptions o = base;
      o.checkpoint = (fs::path(w.dir) / formats::deepspeed::step_tag(*step)).string();
      o.step = -1;  // from the checkpoint: its tag, global_steps and iteration must agree (else NOT saved)
      const int64_t before = last;
      last = *step;
      auto t0 = std::chrono::steady_clock::now();
      try {
        auto summary = pec_save(o, {}, nullptr);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::string line = "pec-save --watch: step " + std::to_string(*step) + " saved from " + o.checkpoint;
        char buf[200];
        for (const auto& t : summary["tiers"]) {
          std::snprintf(buf, sizeof buf, "; %s tier %d experts, %.1f MiB stored", t["tier"].get<std::string>().c_str(),
                        t["stats"]["experts_saved"].get<int>(), t["stats"]["bytes_stored"].get<double>() / 1048576.0);
          line += buf;
        }
        std::snprintf(buf, sizeof buf, " (%.2f s)", s);
        log(line + buf);
        ++result.saved;
        if (w.keep_snapshots > 0) prune_snapshots(w.dir, w.keep_snapshots, *step);
      } catch (const UsageError&) {
        throw;
      } catch (const StoreBusy& e) {
        // Another process holds the store (a restore reading it): the step is tried again at the next poll.
        last = before;
        char buf[64];
        std::snprintf(buf, sizeof buf, "%g", w.poll_seconds);
        log("pec-save --watch: step " + std::to_string(*step) + " not saved yet: " + e.what() + "; trying again in " + buf + " s");
      } catch (const std::exception& e) {
        ++result.failed;
        log("pec-save --watch: step " + std::to_string(*step) + " NOT saved: " + e.what());
      }
      if (last == *step) continue;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(w.poll_seconds);
    while (!g_stop && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGINT, &old_int, nullptr);
  log("pec-save --watch: stopped by signal after " + std::to_string(result.saved) + " saves" +
      (result.failed ? ", " + std::to_string(result.failed) + " steps NOT saved (exit code 1)" : ""));
  return result;
}

}  // namespace ucpkit::pec
