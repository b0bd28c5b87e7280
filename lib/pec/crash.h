// Fault injection for kill-during-save tests: with UCPKIT_PEC_CRASH_AFTER=<n> in the environment,
// the process kills itself (SIGKILL, like `kill -9`) at the n-th crash point it passes. Crash points
// sit between the durable steps of a save: half of an object written, object renamed into place,
// manifest written, manifest renamed, each garbage-collection deletion. With UCPKIT_PEC_FAIL_AFTER=<n>
// it throws Error there instead (an I/O failure on this process only: the MPI failure-protocol test).
#pragma once

namespace ucpkit::pec {

void crash_point(const char* what);

}  // namespace ucpkit::pec
