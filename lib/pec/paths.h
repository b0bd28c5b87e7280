// Paths as a command line gives them: relative to the working folder, `.`, trailing slashes, symbolic
// links to folders. pec-save and pec-restore make every path option absolute once, where the options
// enter the library (pec_save, watch_and_save, pec_restore, pec_restore_plan), so that no later join
// repeats a relative folder and every message names the full path.
#pragma once
#include <initializer_list>
#include <string>

namespace ucpkit::pec {

// `path` made absolute against the working folder, without `.` components, repeated or trailing
// slashes; "" stays "". A `..` is left to the system (after a symbolic link it leads to the link
// target's parent, which a lexical cut would get wrong), except a last one, which is resolved so that
// the folder keeps its name. The path need not exist.
std::string absolute_path(const std::string& path);

// Each of the options' path fields made absolute in place (absolute_path).
void make_absolute(std::initializer_list<std::string*> paths);

}  // namespace ucpkit::pec
