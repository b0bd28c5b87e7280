// AutoEP under ZeRO-3: what every DP rank's model file must agree on (docs/formats.md "AutoEP under
// ZeRO-3"). Read by the universal extract plan and by PEC's expert byte ranges.
#pragma once
#include <string>
#include <vector>

#include "formats/deepspeed/autoep.h"

namespace ucpkit::formats::deepspeed {

// Every DP rank's ds_autoep_layers (`of_rank[d]`, read from `model_files[d]`) must describe the same
// layers as DP rank 0's (only the saving rank's place differs, engine.py:4986-5017), with ep_size and
// expert-DP world size fitting the `dp` ranks. Throws Error naming the file that differs.
void check_autoep_ranks_agree(const std::vector<std::vector<AutoEpLayer>>& of_rank,
                              const std::vector<std::string>& model_files, int dp);

}  // namespace ucpkit::formats::deepspeed
