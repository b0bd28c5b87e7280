#include "formats/hf/engine_plan.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"

namespace ucpkit::formats::hf {

namespace {

// Whether `name` is template `t` with {L} replaced by a layer number; that number in `layer` (-1: no {L}).
bool matches(const std::string& t, const std::string& name, long& layer) {
  const auto at = t.find("{L}");
  layer = -1;
  if (at == std::string::npos) return t == name;
  const std::string head = t.substr(0, at), tail = t.substr(at + 3);
  if (name.size() <= head.size() + tail.size() || name.compare(0, head.size(), head) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  layer = std::stol(digits);
  return true;
}

}  // namespace

std::vector<size_t> engine_order(const Family& family, const std::vector<std::string>& names, const std::string& where) {
  const auto& order = family.module_order;
  if (order.empty())
    throw Error(where + ": the family map " + family.origin + " gives no module_order (transformers' parameter order), "
                "which a DeepSpeed engine checkpoint of the model is laid out in");
  // Entries without {L} before the first layer entry come first, those after the last one come last.
  size_t first_layer = order.size(), last_layer = 0;
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i].find("{L}") != std::string::npos) first_layer = std::min(first_layer, i), last_layer = i;
  std::vector<std::tuple<int, long, size_t, size_t>> keys;  // (section, layer, entry, name index)
  for (size_t n = 0; n < names.size(); ++n) {
    bool found = false;
    for (size_t i = 0; i < order.size() && !found; ++i) {
      long layer = -1;
      if (!matches(order[i], names[n], layer)) continue;
      const int section = layer >= 0 ? 1 : i < first_layer ? 0 : 2;
      if (layer < 0 && i > first_layer && i < last_layer)
        throw Error(family.origin + ": module_order entry " + order[i] + " has no {L} but lies between layer entries");
      keys.emplace_back(section, layer, i, n);
      found = true;
    }
    if (!found)
      throw Error(where + ": parameter " + names[n] + " is in no module_order entry of the family map " + family.origin);
  }
  std::sort(keys.begin(), keys.end());
  std::vector<size_t> out;
  for (const auto& k : keys) out.push_back(std::get<3>(k));
  return out;
}

std::pair<std::string, std::string> tied_output(const Family& family) {
  std::vector<const Rule*> head, embedding;
  for (const auto& r : family.rules)
    if (r.vocab && r.hf.size() == 1) (r.optional ? head : embedding).push_back(&r);
  if (head.size() != 1 || embedding.size() != 1)
    throw Error(family.origin + ": not one embedding and one optional output layer among the vocabulary rules");
  return {head[0]->hf[0], embedding[0]->hf[0]};
}

}  // namespace ucpkit::formats::hf
