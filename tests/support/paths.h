// Where a test finds the tools, the sources, the Python that runs its checks and its area's fixtures: the
// compile definitions tests/CMakeLists.txt gives every test file, named once here (test files are compiled
// in batches, so two of them may not each define these).
#pragma once
#include <cstdlib>
#include <string>

// The tools under test; UCPKIT_TEST_BIN runs the tests against another build's (to see a test fail before a change).
inline const std::string kBin = std::getenv("UCPKIT_TEST_BIN") ? std::getenv("UCPKIT_TEST_BIN") : UCPKIT_BIN_DIR;
inline const std::string kSrc = UCPKIT_SOURCE_DIR;
inline const std::string kPy = UCPKIT_PYTHON;
#ifdef UCPKIT_FIXTURES_DIR
inline const std::string kFx = UCPKIT_FIXTURES_DIR;
#endif
