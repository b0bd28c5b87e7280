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
//  * Megatron router trace JSONL: one object per line with the MoE layer (`layer`, `moe_layer` or
//    `layer_idx`) and either per-expert counts (`tokens_per_expert`, `expert_counts`, `counts`) or the
//    routed expert ids of each token (`experts`, `topk_ids`, `indices`; nested lists are flattened).
//    Lines of one layer are summed.
// Throws Error (naming `name`) on malformed input.
TokenMatrix parse_tokens(std::string_view text, const std::string& name);
TokenMatrix load_tokens(const std::string& path);

// Pads or checks the matrix against the model shape: missing layers/experts count 0, values beyond
// the shape are an error.
TokenMatrix fit_tokens(const TokenMatrix& tokens, const std::vector<int>& experts_per_layer,
                       const std::string& name);
TokenMatrix zero_tokens(const std::vector<int>& experts_per_layer);
TokenMatrix add_tokens(const TokenMatrix& a, const TokenMatrix& b);

nlohmann::json tokens_to_json(const TokenMatrix& t);
TokenMatrix tokens_from_json(const nlohmann::json& j, const std::string& name);

}  // namespace ucpkit::pec
