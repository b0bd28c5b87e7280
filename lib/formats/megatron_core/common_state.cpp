#include "formats/megatron_core/common_state.h"

#include <filesystem>

#include "core/error.h"
#include "formats/dcp/reader.h"
#include "formats/megatron_core/config.h"
#include "io/torch/torch_file.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::megatron_core {

std::optional<int64_t> CommonState::iteration() const {
  const auto v = root ? root->get("iteration") : nullptr;
  if (!v || !v->is(pickle::Kind::Int)) return std::nullopt;
  return v->i;
}

std::optional<double> CommonState::checkpoint_version() const {
  const auto v = root ? root->get("checkpoint_version") : nullptr;
  if (!v) return std::nullopt;
  if (v->is(pickle::Kind::Float)) return v->f;
  if (v->is(pickle::Kind::Int)) return static_cast<double>(v->i);
  return std::nullopt;
}

std::optional<std::string> CommonState::content_string(std::string_view key) const {
  const auto md = root ? root->get("content_metadata") : nullptr;
  const auto v = md ? md->get(key) : nullptr;
  if (!v || !v->is(pickle::Kind::Str)) return std::nullopt;
  return v->s;
}

pickle::ValuePtr CommonState::arg(std::string_view name) const {
  const auto args = root ? root->get("args") : nullptr;
  if (!args || !args->is(pickle::Kind::Object)) return nullptr;
  return args->attr(name);
}

CommonState read_common_state(const std::string& dir, const dcp::Reader& reader) {
  CommonState c;
  const std::string legacy = (fs::path(dir) / kLegacyCommonFile).string();
  if (fs::exists(legacy)) {
    c.legacy = true;
    c.source = legacy;
    c.root = load_torch(legacy);
  } else {
    const auto* e = reader.metadata().find(kCommonStateKey);
    if (!e || !e->is_bytes)
      fail(reader.metadata().path, std::string("no common state: neither ") + kLegacyCommonFile +
                                       " nor the bytes item " + kCommonStateKey);
    const auto& item = reader.metadata().item_of(kCommonStateKey, nullptr);
    c.source = (fs::path(dir) / item.storage.relative_path).string();
    const auto bytes = reader.read_bytes(kCommonStateKey);
    const auto list = load_torch_bytes(bytes, c.source + " (" + kCommonStateKey + ")").root;
    // ShardedObject items are torch.save([obj.data for obj in shard objects]): a list of one.
    if (!list || !list->is(pickle::Kind::List) || list->items.size() != 1)
      fail(c.source, std::string(kCommonStateKey) + ": expected a list of one object");
    c.root = list->items[0];
  }
  if (!c.root || !c.root->is(pickle::Kind::Dict)) fail(c.source, "common state: expected a dict");
  return c;
}

}  // namespace ucpkit::formats::megatron_core
