// Whether load_torch_file / load_torch (files on disk) check every zip record's CRC-32 even when
// TorchLoadOptions does not ask for it: on by default, so a flipped bit in a checkpoint is refused
// instead of converted; the tools' --no-verify turns it off for the process. A file is checked once
// per process (path, size and mtime remembered).
#pragma once

namespace ucpkit {

void set_verify_files_crc(bool on);
bool verify_files_crc();

}  // namespace ucpkit
