// Identity fields of DeepSpeed / Megatron-DeepSpeed checkpoint files.
#include "formats/deepspeed/save_identity.h"

#include <cstdio>
#include <cstring>

namespace ucpkit::formats::deepspeed {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

// Top-level keys of a model-states file that every file of one save repeats unchanged.
constexpr const char* kModelKeys[] = {"iteration",     "global_steps",  "global_samples", "skipped_steps", "tokens",
                                      "dp_world_size", "mp_world_size", "ds_version",     "checkpoint_version"};

// Megatron `args` fields that are the same on every rank of one run and define the model, the
// parallel layout or the training progress.
constexpr const char* kArgsFields[] = {
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "world_size",
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_key_value_heads", "seq_length",
    "max_position_embeddings", "padded_vocab_size", "make_vocab_size_divisible_by", "num_experts",
    "moe_expert_parallel_size", "iteration", "consumed_train_samples", "consumed_valid_samples",
    "consumed_train_tokens"};

std::string tensor_text(const Tensor& t) {
  if (t.numel() > 16) return "<tensor of " + std::to_string(t.numel()) + " elements>";
  const Tensor c = t.contiguous();
  const auto bytes = c.contiguous_bytes();
  std::string out = "tensor(";
  const size_t n = static_cast<size_t>(c.numel());
  for (size_t i = 0; i < n; ++i) {
    char buf[64];
    const uint8_t* p = bytes.data() + i * dtype_size(c.dtype());
    switch (c.dtype()) {
      case DType::Float32: {
        float f;
        std::memcpy(&f, p, 4);
        std::snprintf(buf, sizeof buf, "%.9g", f);
        break;
      }
      case DType::Float64: {
        double f;
        std::memcpy(&f, p, 8);
        std::snprintf(buf, sizeof buf, "%.17g", f);
        break;
      }
      case DType::Int64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
        break;
      }
      case DType::Int32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        std::snprintf(buf, sizeof buf, "%d", v);
        break;
      }
      default: {  // bitwise
        std::string hex = "0x";
        for (size_t b = 0; b < dtype_size(c.dtype()); ++b) {
          char h[3];
          std::snprintf(h, sizeof h, "%02x", p[b]);
          hex += h;
        }
        std::snprintf(buf, sizeof buf, "%s", hex.c_str());
      }
    }
    out += (i ? ", " : "") + std::string(buf);
  }
  return out + ", dtype=" + std::string(dtype_name(c.dtype())) + ")";
}

void add(IdentityFields& out, std::string field, const ValuePtr& v) {
  if (v) out.emplace_back(std::move(field), identity_text(v));
}

}  // namespace

std::string identity_text(const ValuePtr& v) {
  if (!v) return "<absent>";
  switch (v->kind) {
    case Kind::None: return "None";
    case Kind::Bool: return v->b ? "True" : "False";
    case Kind::Int: return std::to_string(v->i);
    case Kind::Float: {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", v->f);
      return buf;
    }
    case Kind::Str: return "'" + v->s + "'";
    case Kind::Tensor: return v->tensor ? tensor_text(*v->tensor) : "<tensor>";
    case Kind::List:
    case Kind::Tuple: {
      std::string out = v->kind == Kind::List ? "[" : "(";
      for (size_t i = 0; i < v->items.size(); ++i) out += (i ? ", " : "") + identity_text(v->items[i]);
      return out + (v->kind == Kind::List ? "]" : ")");
    }
    default: return v->repr(2);
  }
}

IdentityFields model_file_identity(const ValuePtr& root) {
  IdentityFields out;
  if (!root || root->kind != Kind::Dict) return out;
  for (const char* k : kModelKeys) add(out, k, root->get(k));
  if (auto args = root->get("args"); args && args->kind == Kind::Object)
    for (const char* f : kArgsFields) add(out, std::string("args.") + f, args->attr(f));
  return out;
}

IdentityFields optim_file_identity(const ValuePtr& root) {
  IdentityFields out;
  if (!root || root->kind != Kind::Dict) return out;
  // Compared among optimizer shards only: a conversion to another native-MoE version line rewrites
  // the model files' ds_version (formats/deepspeed/line_rewrite.h) and keeps the shards' bytes.
  add(out, "ds_version of the optimizer shards", root->get("ds_version"));
  if (auto osd = root->get("optimizer_state_dict"); osd && osd->kind == Kind::Dict)
    add(out, "ds_version of the optimizer shards", osd->get("ds_version"));
  return out;
}

}  // namespace ucpkit::formats::deepspeed
