// Plain-data pickle values (dicts, lists, numbers, strings) as JSON: universal_checkpoint_info and
// optimizer hyper-parameters travel through plans and manifests this way.
#pragma once
#include <nlohmann/json.hpp>

#include "io/pickle/value.h"

namespace ucpkit::to_universal {

// Tensors, objects and other non-JSON values become a string "<kind>"; tuples become arrays.
nlohmann::json value_to_json(const pickle::ValuePtr& v);
// Dict entry with an integer key (torch optimizer state is keyed by param index); nullptr if absent.
pickle::ValuePtr get_int_key(const pickle::ValuePtr& dict, int64_t key);

}  // namespace ucpkit::to_universal
