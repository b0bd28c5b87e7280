#!/usr/bin/env bash
# The grep-able rules of docs/architecture.md ("Rooms and the dependency rule", issue 29; rule 3, issue 46):
#  1. Outside lib/formats/ and lib/io/, no library or driver file spells a DeepSpeed pickle key, a
#     DeepSpeed file-name pattern or the flat-buffer padding rule: those facts have one home each
#     (lib/formats/deepspeed/, lib/formats/universal/). A string that is also one of ucpkit's own JSON
#     keys is listed in allowed.txt beside this script with the reason.
#  2. The tool modules (to_universal, reshard, pec, placement) never include each other, except
#     reshard -> to_universal/direct.h (direct mode reaches the extract planner, and the torch_dist
#     one pass the union's torch_dist pieces, through that one header). Rooms below them (core, parallel, io, patterns, formats) include no tool module.
#  3. Outside lib/formats/, no code tests a folder for a format's marker file (manifest.json, plan.json,
#     PEC_STORE, .metadata, metadata.json, the trackers): formats::detect is the one answer.
#  4. Outside lib/formats/, an outside format's folder kind is named only in a file that registers that
#     format's code for a tool; everything that routes on a folder's kind asks the registries.
#  5. No comment or code in lib/ (*.h, *.cpp) says "issue N": a comment keeps the reason, not the
#     issue it came from (the history and figures live in docs/notes/).
#  6. No function in lib/ is longer than 120 lines (Universal Ctags' line: and end:, end - line + 1),
#     except those listed in long_functions.txt beside this script (`path function  # reason`); a listed
#     one that no longer exceeds 120 lines fails too, so the list only shrinks. Needs Universal Ctags
#     (Debian: universal-ctags, in scripts/setup.sh --tests); without it the rule fails and says so.
#  7. lib/placement/ is formatted as the root .clang-format says (`clang-format --dry-run --Werror`);
#     skipped, with a message, where clang-format is not installed (scripts/setup.sh --tests installs it).
#  8. Tests mirror the library: every lib/<dir>/<name>.cpp over 150 lines has tests/<dir>/<name>_test.cpp,
#     except those listed in untested.txt beside this script with the reason (that list only shrinks too).
#  9. Every test file tests/<folder>/<path>_test.cpp keeps its code in `namespace <path>_test` (its path
#     inside the folder, '/' as '_'): test files are compiled in batches (tests/CMakeLists.txt), and a
#     helper of one file must neither clash with nor silently overload a neighbour's.
# Usage: tests/rooms/check_rooms.sh [SOURCE_DIR] [--list]   (exit 0: the rules hold; 1: each violation listed;
#        --list prints the derived schema strings and exits)
set -uo pipefail
list=0 dir=$(dirname "$0")/../..
for a in "$@"; do if [ "$a" = --list ]; then list=1; else dir=$a; fi; done
src=$(cd "$dir" && pwd)
here=$src/tests/rooms
cd "$src" || exit 2
bad=0

# Rule 1: DeepSpeed schema strings, derived from the code that owns them: every string literal of
# lib/formats/deepspeed/ and of the universal checkpoint's DeepSpeed-defined files
# (lib/formats/universal/state_file.*, join.*: what ds_to_universal.py writes; manifest.json is
# ucpkit's own), comments left out, that is a key or a file-name part ([a-z_][a-z0-9_.]+), less the
# words in not_schema.txt (generic vocabulary and ucpkit's own names, each with its reason).
schema_sources=$(ls lib/formats/deepspeed/*.h lib/formats/deepspeed/*.cpp lib/formats/universal/state_file.* \
                    lib/formats/universal/join.*)
strip_comments() { sed -E -e 's@(^|[[:space:]])//.*$@@' "$@"; }
not_schema=$(sed -e 's/[[:space:]]*#.*$//' "$here/not_schema.txt" | grep -v '^$' | sort -u)
schema=$(strip_comments $schema_sources | grep -oE '"[a-z_][a-z0-9_.]+"' | tr -d '"' | sort -u |
         comm -23 - <(printf '%s\n' "$not_schema"))
[ $list -eq 1 ] && { printf '%s\n' "$schema"; exit 0; }
[ "$(wc -l <<< "$schema")" -ge 100 ] || { echo "rule 1: only $(wc -l <<< "$schema") schema strings derived (expected 100+)"; exit 1; }
keys=$(printf '%s\n' "$schema" | sed -e 's/[.]/\\./g' | paste -sd'|')
hits=$(for f in $(grep -rlE "\"($keys)\"" lib apps --include='*.h' --include='*.cpp' | grep -vE '^lib/(formats|io)/'); do
         strip_comments "$f" | grep -oE "\"($keys)\"" | sed -e "s|^|$f: |"
       done | sort -u)
# The shard file-name parts (mp_rank_, zero_pp_rank_, _optim_states.pt, ...) also inside a longer name or
# pattern ("mp_rank_00_model_states.pt", "%s/mp_rank_%02d..."); a message (a literal with a space) may name them.
parts=$(printf '%s\n' "$schema" | grep -E 'rank_|\.pt$' | sed -e 's/[.]/\\./g' | paste -sd'|')
hits+=$'\n'$(for f in $(grep -rlE "\"[^\" ]*($parts)[^\" ]*\"" lib apps --include='*.h' --include='*.cpp' | grep -vE '^lib/(formats|io)/'); do
         strip_comments "$f" | grep -oE "\"[^\" ]*($parts)[^\" ]*\"" | sed -e "s|^|$f: |"
       done | sort -u)
while IFS= read -r hit; do
  [ -n "$hit" ] || continue
  if ! grep -qxF "$hit" <(sed -e 's/[[:space:]]*#.*$//' "$here/allowed.txt" | grep -v '^$'); then
    echo "rule 1: $hit (a DeepSpeed schema string outside lib/formats and lib/io)"
    bad=1
  fi
done <<< "$hits"
# The ZeRO-1/2 flat-buffer padding (a multiple of 2 * dp) is spelled only in formats/deepspeed/zero_partition.
pad=$(grep -rnE '2 \* (dp|world|partition|ranks|count)\b' lib --include='*.cpp' --include='*.h' |
      grep -vE '^lib/formats/deepspeed/zero_partition\.' | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true)
[ -z "$pad" ] || { echo "rule 1 (padding): $pad"; bad=1; }

# Rule 2: includes between rooms.
modules='to_universal|reshard|pec|placement'
for m in to_universal reshard pec placement core parallel io patterns formats; do
  [ -d "lib/$m" ] || continue
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<< "$line")
    [ "$target" = "$m" ] && continue
    [ "$m" = reshard ] && grep -q '#include "to_universal/direct.h"' <<< "$line" && continue
    echo "rule 2: $line (lib/$m may not include lib/$target)"
    bad=1
  done < <(grep -rnE "#include \"($modules|inspect|tool|gpu)/" "lib/$m" || true)
done
# Rule 3 (issue 46): what a folder is has one answer, formats::detect; only lib/formats/ (each format's
# folder_format registration) tests a folder for a format's marker file.
markers='kUniversalManifestName|kWorkPlanName|kPecStoreMarker|kConfigFile|kTrackerFile|kLatestName|"\.metadata"|"metadata\.json"|"plan\.json"|"manifest\.json"|"PEC_STORE"|"latest"|"latest_checkpointed_iteration\.txt"'
while IFS= read -r line; do
  [ -n "$line" ] || continue
  echo "rule 3: $line (a format's marker tested outside lib/formats: ask formats::detect)"
  bad=1
done < <(grep -rnE "(exists|is_regular_file)\(([^()]|\([^()]*\))*($markers)" lib apps --include='*.h' --include='*.cpp' | grep -vE '^lib/formats/' || true)
# Rule 4 (issue 46): outside lib/formats/, a file names an outside format's folder kind (formats::kDeepSpeed,
# kDcp, kTorchDist, any later k<Format> of formats/detect.h; the DCP reader's FolderKind values; a kind's
# name compared with a literal) only when it is that format's code for a tool, which it registers in the
# same file (register_union, register_describer, register_direct_reader, register_template_reader, a
# NamedTable's set): routing code asks the registries. ucpkit's own folders (universal, work-folder,
# pec-store) are the tools' hub and may be named.
own='kUniversal|kWorkFolder|kPecStore'
outside=$(grep -oE 'inline constexpr std::string_view k[A-Za-z]+' lib/formats/detect.h | awk '{print $4}' |
          grep -vxE "$own" | paste -sd'|')
[ -n "$outside" ] || { echo "rule 4: no format names found in lib/formats/detect.h"; exit 1; }
while IFS= read -r f; do
  [ -n "$f" ] || continue
  for k in $(strip_comments "$f" | grep -oE "formats::($outside)\b" | sed -e 's/formats:://' | sort -u); do
    # a registration call on the line or the one before (a call broken after its opening parenthesis)
    strip_comments "$f" | grep -B1 -E "formats::$k\b" | grep -qE "register_[a-z_]*\(|\.set\(" && continue
    strip_comments "$f" | grep -nE "formats::$k\b" | sed -e "s|^|rule 4: $f:|" -e 's|$| (a format named outside its registered code: ask a registry)|'
    bad=1
  done
done < <(grep -rlE "formats::($outside)\b" lib apps --include='*.h' --include='*.cpp' | grep -vE '^lib/formats/' || true)
lit=$(grep -rnE '(\.name\(\)|kind\.format) *[!=]= *"|dcp::FolderKind::[A-Z]' lib apps --include='*.h' --include='*.cpp' |
      grep -vE '^lib/formats/' | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true)
while IFS= read -r f; do
  [ -n "$f" ] || continue
  hit=$(grep -E "^$f:" <<< "$lit")
  # the DCP reader's kinds only in a file that registers a DCP format's code
  grep -qE "register_[a-z_]*\(.*formats::($outside)|\.set\(.*formats::($outside)" "$f" && ! grep -qE '(\.name\(\)|kind\.format) *[!=]= *"' <<< "$hit" && continue
  printf '%s\n' "$hit" | sed -e 's|^|rule 4: |' -e 's|$| (a folder kind compared outside lib/formats: ask a registry)|'
  bad=1
done < <(cut -d: -f1 <<< "$lit" | sort -u | grep -v '^$')

# Rule 5: no "issue N" in lib/: the reason stays in the comment, its history goes to docs/notes/.
while IFS= read -r line; do
  [ -n "$line" ] || continue
  echo "rule 5: $line (an issue number in lib/: keep the reason, move the history to docs/notes/)"
  bad=1
done < <(grep -rniE 'issues? [0-9]' lib --include='*.h' --include='*.cpp' || true
         # the same reference broken across two comment lines ("... (issue" / "// 31: ...")
         find lib \( -name '*.h' -o -name '*.cpp' \) -exec awk 'FNR == 1 { prev = "" } prev ~ /[Ii]ssues?$/ && /^[[:space:]]*\/\/ *[0-9]/ {
             print FILENAME ":" FNR ": " $0 } { prev = $0 }' {} +)

# Rule 6: no function in lib/ longer than 120 lines but the listed exceptions, which must still exceed it.
max_lines=120
if ! command -v ctags > /dev/null; then
  echo "rule 6: ctags not found: install Universal Ctags (Debian: universal-ctags; scripts/setup.sh --tests)"
  bad=1
elif ! ctags --version 2> /dev/null | grep -q 'Universal Ctags'; then
  echo "rule 6: $(command -v ctags) is not Universal Ctags (it needs --fields=+ne): install universal-ctags"
  bad=1
else
  long=$(ctags --fields=+ne --c++-kinds=f -R -o - lib 2> /dev/null |
         awk -F'\t' -v max=$max_lines '{ l = e = ""
           for (i = 4; i <= NF; i++) { if ($i ~ /^line:/) l = substr($i, 6); if ($i ~ /^end:/) e = substr($i, 5) }
           if (l != "" && e != "" && e - l + 1 > max) print $2 " " $1 " " e - l + 1 }' | sort -u)
  known=$(sed -e 's/[[:space:]]*#.*$//' -e 's/[[:space:]]\+/ /g' -e 's/ $//' "$here/long_functions.txt" | grep -v '^$')
  while IFS=' ' read -r f fn n; do
    [ -n "$f" ] || continue
    grep -qxF "$f $fn" <<< "$known" && continue
    echo "rule 6: $f: $fn is $n lines (over $max_lines: split it into named steps)"
    bad=1
  done <<< "$long"
  while IFS=' ' read -r f fn; do
    [ -n "$f" ] || continue
    grep -q "^$f $fn " <<< "$long" && continue
    echo "rule 6: $f $fn is listed in tests/rooms/long_functions.txt but no longer exceeds $max_lines lines: remove its line"
    bad=1
  done <<< "$known"
fi

# Rule 7: lib/placement/ follows .clang-format (the folders reformatted so far).
formatted='lib/placement'
if ! command -v clang-format > /dev/null; then
  echo "rule 7: skipped: clang-format not found (scripts/setup.sh --tests installs it)"
else
  if ! out=$(clang-format --dry-run --Werror $(find $formatted -name '*.h' -o -name '*.cpp' | sort) 2>&1); then
    printf '%s\n' "$out" | grep -E '^[^ ].*(error|warning):' | head -20 | sed -e 's|^|rule 7: |'
    echo "rule 7: $formatted is not formatted as .clang-format says: run clang-format -i on its files"
    bad=1
  fi
fi
# Rule 8: tests mirror the library: every lib/<dir>/<name>.cpp over 150 lines has tests/<dir>/<name>_test.cpp,
# but the exceptions tests/rooms/untested.txt lists with a reason (which must still be over 150 lines, untested).
min_test_lines=150
untested=$(sed -e 's/[[:space:]]*#.*$//' -e 's/[[:space:]]*$//' "$here/untested.txt" | grep -v '^$' || true)
while IFS= read -r f; do
  [ "$(wc -l < "$f")" -gt $min_test_lines ] || continue
  rel=${f#lib/}
  [ -f "tests/${rel%.cpp}_test.cpp" ] && continue
  grep -qxF "$f" <<< "$untested" && continue
  echo "rule 8: $f has $(wc -l < "$f") lines and no tests/${rel%.cpp}_test.cpp (write it, or list the file with a reason in tests/rooms/untested.txt)"
  bad=1
done < <(find lib -name '*.cpp' | sort)
while IFS= read -r f; do
  [ -n "$f" ] || continue
  rel=${f#lib/}
  if [ ! -f "$f" ] || [ "$(wc -l < "$f")" -le $min_test_lines ] || [ -f "tests/${rel%.cpp}_test.cpp" ]; then
    echo "rule 8: $f is listed in tests/rooms/untested.txt but is gone, short or tested: remove its line"
    bad=1
  fi
done <<< "$untested"
# Rule 9: each test file's namespace, named after its path inside its tests/ folder.
while IFS= read -r f; do
  rel=${f#tests/*/}
  ns=${rel%.cpp}; ns=${ns//\//_}
  grep -qx "namespace $ns {" "$f" && continue
  echo "rule 9: $f has no line 'namespace $ns {' (its code goes in that namespace: test files are compiled in batches)"
  bad=1
done < <(find tests -name '*_test.cpp' | sort)
[ $bad -eq 0 ] && echo "rooms: the nine rules hold"
exit $bad
