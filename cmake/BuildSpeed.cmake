# Build time (measured in docs/install.md). About half of a library translation unit's compile time is
# parsing the same heavy headers (nlohmann/json ~1.2 s, TBB ~0.9 s, the standard library), so the
# library compiles them once into a precompiled header (UCPKIT_PCH). A changed libucpkit.so does not
# relink the tools and tests (they bind its symbols at run time): a new commit recompiles one file
# (the git commit's) and relinks one library.
set(CMAKE_LINK_DEPENDS_NO_SHARED ON)
option(UCPKIT_PCH "Precompile the heavy headers of libucpkit (nlohmann/json, TBB, standard library)" ON)

# Applies the build-time settings to a target of lib/.
function(ucpkit_fast_build target)
  if(UCPKIT_PCH)
    target_precompile_headers(${target} PRIVATE
      <algorithm> <cstdint> <cstring> <filesystem> <functional> <map> <memory> <optional> <set> <string>
      <string_view> <vector> <nlohmann/json.hpp> <tbb/parallel_for.h>)
  endif()
endfunction()

