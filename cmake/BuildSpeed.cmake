# Build time (measured in docs/install.md). About half of a library translation unit's compile time is
# parsing the same heavy headers (nlohmann/json ~1.2 s, TBB ~0.9 s, the standard library), so the
# library compiles them once into a precompiled header (UCPKIT_PCH). A changed libucpkit.so does not
# relink the tools and tests (they bind its symbols at run time): a new commit recompiles one file
# (the git commit's) and relinks one library.
set(CMAKE_LINK_DEPENDS_NO_SHARED ON)
option(UCPKIT_PCH "Precompile the heavy headers of libucpkit (nlohmann/json, TBB, standard library)" ON)
# Unity build: libucpkit's sources compiled 8 to a translation unit. The templates they share (nlohmann/json,
# the standard library's containers) are then instantiated and optimized once per batch instead of once per
# file: 1,067 -> 582 CPU s for the library on this 2-core machine kind (docs/notes/ci-times.md). A file's
# names at namespace scope must then differ from its batch neighbours' (the registrations carry their file's
# name); a collision is a compile error, never a silent merge. Off for a file-at-a-time build while editing.
option(UCPKIT_UNITY "Compile libucpkit's sources in batches (unity build)" ON)

# GCC collects its garbage each time its heap grew by a third past a small floor: a seventh of a library batch's
# compile time and a tenth of a test file's (-ftime-report). Collecting only past 1 GB, and then at 4x, compiles
# the library batches 12% and the test files 8% faster, about a third more memory per compile (1.1 GB at most
# here); the objects are byte-identical (docs/notes/ci-times.md).
option(UCPKIT_GCC_LATE_GC "GCC: collect the compiler's garbage later (faster builds, up to ~1.1 GB a compile)" ON)
if(UCPKIT_GCC_LATE_GC AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:--param=ggc-min-expand=400;--param=ggc-min-heapsize=1048576>")
endif()

# Applies the build-time settings to a target of lib/.
function(ucpkit_fast_build target)
  if(UCPKIT_PCH)
    target_precompile_headers(${target} PRIVATE
      <algorithm> <cstdint> <cstring> <filesystem> <functional> <map> <memory> <optional> <set> <string>
      <string_view> <vector> <nlohmann/json.hpp> <tbb/parallel_for.h>)
  endif()
  if(UCPKIT_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()

