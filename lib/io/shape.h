// Tensor shapes as plain vectors (pickled torch.Size, manifest and plan shapes).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ucpkit {

// Product of the dimensions (1 for a scalar's empty shape).
int64_t numel_of(const std::vector<int64_t>& shape);
// "[2, 3]" (error messages).
std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace ucpkit
