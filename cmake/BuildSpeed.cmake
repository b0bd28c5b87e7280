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

# The tool drivers (one translation unit each, ~10 s apiece, most of it CLI11 and the driver glue):
# one precompiled header made for the first tool and reused by the others (same flags).
function(ucpkit_fast_tools)
  if(NOT UCPKIT_PCH OR NOT ARGN)
    return()
  endif()
  list(GET ARGN 0 first)
  target_precompile_headers(${first} PRIVATE <CLI/CLI.hpp> <nlohmann/json.hpp> "${CMAKE_SOURCE_DIR}/lib/tool/cli.h")
  foreach(tool ${ARGN})
    if(NOT tool STREQUAL first)
      target_precompile_headers(${tool} REUSE_FROM ${first})
    endif()
  endforeach()
endfunction()
