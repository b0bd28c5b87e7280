// A PEC store tier's marker file (docs/pec.md): pec/store.cpp writes it, formats::detect knows a store by it.
#pragma once

namespace ucpkit::formats {

inline constexpr const char* kPecStoreMarker = "PEC_STORE";

}  // namespace ucpkit::formats
