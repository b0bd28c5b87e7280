// Whether load_torch_file / load_torch (files on disk) check every zip record's CRC-32 even when
// TorchLoadOptions does not ask for it: on by default, so a flipped bit in a checkpoint is refused
// instead of converted; the tools' --no-verify turns it off for the process (set once, from the
// command line). A caller that checks a file's CRCs itself says so per open
// (TorchLoadOptions::crc_at_open). A file is checked once per process (path, size and mtime remembered).
#pragma once
#include <cstddef>

namespace ucpkit {

void set_verify_files_crc(bool on);
bool verify_files_crc();
// How many files an open has checked in this process so far (tests: which opens check).
size_t files_crc_checked_at_open();

}  // namespace ucpkit
