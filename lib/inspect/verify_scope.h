// The readers' zip CRC-32 check of every torch file (io/torch/verify.h, a process-wide switch) set for
// the lifetime of one ucp-info / ucp-diff call, then put back as it was.
#pragma once
#include "io/torch/verify.h"

namespace ucpkit::inspect {

class VerifyFiles {
 public:
  explicit VerifyFiles(bool on) : was_(verify_files_crc()) { set_verify_files_crc(on); }
  ~VerifyFiles() { set_verify_files_crc(was_); }
  VerifyFiles(const VerifyFiles&) = delete;
  VerifyFiles& operator=(const VerifyFiles&) = delete;

 private:
  bool was_;
};

}  // namespace ucpkit::inspect
