// Universal layout files.
#include "to_universal/save.h"


#include <algorithm>
#include <vector>

#include "core/crc32.h"
#include "core/error.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/deepspeed/storage_tags.h"
#include "formats/universal/join.h"
#include "formats/universal/state_file.h"

namespace ucpkit::to_universal {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

ValuePtr state_file_value(const Tensor& param, const patterns::ParamRule& rule, const patterns::PatternSet& set) {
  formats::universal::StateFile f;
  f.param = param;
  formats::universal::record_join(rule, set, f);
  f.vocab_tensor = rule.vocab;
  return formats::universal::to_pickle(f);
}

ValuePtr common_optimizer_state(const ValuePtr& root, const std::string& path) {
  if (!root || root->kind != Kind::Dict) fail(path, "not an optimizer-states dict");
  auto osd = formats::deepspeed::raw_optimizer_state_dict(root);
  if (!osd || osd->kind != Kind::Dict) fail(path, "no optimizer_state_dict");
  auto out = Value::dict(osd->ordered);
  for (const auto& [k, v] : osd->entries)
    if (k->kind != Kind::Str || !formats::deepspeed::is_sharded_state(k->s)) out->entries.emplace_back(k, v);
  ValuePtr groups = formats::deepspeed::saved_param_groups(osd);
  out->set_item("param_groups", groups ? groups : Value::list());
  formats::deepspeed::tag_storages_cpu(out);  // ds_to_universal writes it from map_location='cpu' loads
  return out;
}

uint32_t tensor_crc32(const Tensor& t) {
  auto c = t.contiguous();
  return crc32_parallel(c.contiguous_bytes());
}

}  // namespace ucpkit::to_universal
