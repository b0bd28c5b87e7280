// ucp-diff: compares two checkpoints of any layouts value by value through their universal form (two
// DCP folders: entry by entry as saved, non-tensor items included). A
// universal folder is read as it is; a native checkpoint (or ucp-extract work folder) is first
// converted by ucp-union's one-step code path (to_universal::run_union) into a temporary folder that is removed
// on every way out, SIGINT and SIGTERM included. Then every atomic tensor (each parameter's fp32 master
// and optimizer states) is compared: shape, dtype, and the elements bit for bit, or within
// |a - b| <= atol + rtol * |b| when a tolerance is given. A parameter or state in one only is a
// difference.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/reporter.h"

namespace ucpkit::inspect {

// ucp-diff's exit code when both were read and they differ (1 stays "could not compare", 2 usage).
inline constexpr int kDiffer = 3;

struct DiffOptions {
  double rtol = 0, atol = 0;  // both 0: bit for bit (the default)
  std::string tmp_dir;        // where native inputs are converted ("": $TMPDIR, else /tmp)
  int threads = 0;            // ucp-union's threads for the conversion (0: all cores)
  size_t listed = 10;         // differences listed in the result (the first ones, in parameter order)
  bool verify = true;         // inputs' checksums (zip CRC-32 of native files, universal crc32s)
  Reporter reporter;          // the conversion's warnings, details and progress
};

struct TensorDifference {
  std::string param;           // universal name
  std::string state;           // "fp32", "exp_avg", ...; "" for the whole parameter (only in one)
  std::string kind;            // "values", "shape", "dtype", "only_in_a", "only_in_b"
  std::string detail;          // one line for people ("[4, 8] vs [8, 4]")
  int64_t elements = 0;        // values: elements compared
  int64_t differing = 0;       // values: elements that differ (beyond the tolerance)
  double max_abs_diff = 0;     // values: over all elements (NaN against a number: infinity)
};

struct DiffSide {
  std::string input;  // as given
  std::string form;   // "universal" (read as it is), "native" (converted) or "dcp" (two DCPs: read as they are)
};

struct DiffResult {
  DiffSide a, b;
  double rtol = 0, atol = 0;
  size_t tensors = 0;        // atomic tensors in either checkpoint ((parameter, state) pairs)
  size_t tensors_equal = 0;
  size_t differences = 0;    // tensors not equal (a parameter in one only counts each of its states)
  std::vector<TensorDifference> listed;  // the first DiffOptions::listed of them
  // Two DCP folders are compared entry by entry as saved: every tensor in its own dtype
  // (buffers and counters too), every non-tensor item (LR scheduler, dataloader, param_groups...);
  // `items` counts those non-tensor items (in `tensors` and `differences` too).
  size_t items = 0;
  // What the comparison did not look at, said in the verdict: the universal form holds no optimizer
  // steps' or param_groups' differences (they are not compared there).
  std::vector<std::string> skipped;

  bool equal() const { return differences == 0; }
  nlohmann::json to_json() const;  // keys: docs/ucp-info.md
  std::string text() const;        // the short summary ucp-diff prints
};

// Compares `a` and `b`. Throws Error when either cannot be read or converted (nothing is left in the
// temporary folder), UsageError for a negative tolerance.
DiffResult diff_checkpoints(const std::string& a, const std::string& b, const DiffOptions& options);

}  // namespace ucpkit::inspect
