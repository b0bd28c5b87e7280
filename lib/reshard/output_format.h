// What ucp-load writes: a DeepSpeed checkpoint for the target layout, the weights as safetensors
// shards, or a PyTorch Distributed Checkpoint of model and optimizer, or a Megatron-Core torch_dist checkpoint, or a Hugging Face model folder (docs/ucp-load.md, docs/hf.md). One name per format, used by the CLI, `--plan` and `--json`.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ucpkit::reshard {

enum class OutputFormat { DeepSpeed, Safetensors, Dcp, TorchDist, Hf };

// "deepspeed" | "safetensors" | "dcp" | "torch_dist" (Megatron-Core) | "hf" (Hugging Face).
std::string_view output_format_name(OutputFormat f);
// The format named `name`; nullopt for any other name.
std::optional<OutputFormat> output_format_from_name(std::string_view name);
// Every format's name, in declaration order (the CLI's accepted values).
std::vector<std::string> output_format_names();

}  // namespace ucpkit::reshard
