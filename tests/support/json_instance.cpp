// The one instantiation of nlohmann::json's members that json_instance.h declares for the test files.
#include "support/json_instance.h"

template class nlohmann::basic_json<>;
