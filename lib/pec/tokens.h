// Token counts per MoE layer and global expert: the input of the selection policies and of PLT.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ucpkit::pec {

// tokens[moe_layer][global_expert]: tokens routed to that expert (token-expert assignments).
using TokenMatrix = std::vector<std::vector<int64_t>>;

// Parses token counts from text. Formats (detected from the content):
//  * JSON matrix `[[...], ...]` or `{"tokens": [[...]]}`;
//  * CSV: long form with a header naming `layer`/`moe_layer`, `expert`, `tokens`, or a bare matrix
//    (one row per MoE layer);
//  * router trace JSONL (io/router_trace.h, the parser moe-replace uses too): every line's counts
//    added up, over all iterations.
// Throws Error (naming `name`) on malformed input.
TokenMatrix parse_tokens(std::string_view text, const std::string& name);
TokenMatrix load_tokens(const std::string& path);

// The token-count file of one step: `path` itself when it is a file; when it is a folder (a job writing
// one file per checkpoint), its `step<N>.json`, `step<N>.csv` or `step<N>.jsonl` (exactly one of them).
// Throws Error naming the folder and the names looked for when there is none, or more than one.
std::string tokens_file_for_step(const std::string& path, int64_t step);

// Pads or checks the matrix against the model shape: missing layers/experts count 0, values beyond
// the shape are an error.
TokenMatrix fit_tokens(const TokenMatrix& tokens, const std::vector<int>& experts_per_layer,
                       const std::string& name);
TokenMatrix zero_tokens(const std::vector<int>& experts_per_layer);
TokenMatrix add_tokens(const TokenMatrix& a, const TokenMatrix& b);

nlohmann::json tokens_to_json(const TokenMatrix& t);
TokenMatrix tokens_from_json(const nlohmann::json& j, const std::string& name);

}  // namespace ucpkit::pec
