#!/usr/bin/env bash
# Every framework check, outside CI, and one table of what the frameworks judged (issue 48;
# docs/frameworks-outside-ci.md). Runs, one after the other:
#   * the ctest-registered checks, tests/frameworks/*_test.sh BUILD (label `frameworks`; whatever is there);
#   * the verify scripts ported to the pinned environment: scripts/verify/dcp_verify.sh, scripts/verify/dcp_load_verify.sh,
#     scripts/verify/torch_dist_verify.sh, scripts/verify/megatron_core_load_verify.sh, scripts/verify/hf_resume_verify.sh
#     (each with BUILD).
# Each prints `RESULT framework=F version=V case=C tensors=N equal=yes|no [more=...]` lines; a check that prints
# none is one row from its exit code (0: equal, 77: not run, else: no). A check that exits non-zero after
# printing only equal rows gets one more row that says so.
#
#   scripts/frameworks/run_all.sh [BUILD] [NAME...]   # BUILD: build folder or install prefix (default build/)
#                                                     # NAME: only the checks whose name contains one of them
# Environment: passed on to the checks (FRAMEWORKS_PY, MEGATRON_GIT, MEGATRON_SRC, MCORE, TORCH2LAB,
# TEST_FORMATS, FIXTURES, ...); RUN_ALL_TIMEOUT (seconds a check may take, default 1800); RUN_ALL_LOGS (folder
# for the logs and table.md, default a new temporary folder, kept).
# Prints the table (Markdown) and a total line; exit 0 only if every row is equal (a check not run is not).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd) || exit 2
shift $(($# > 0 ? 1 : 0))
only=("$@")
logs=${RUN_ALL_LOGS:-$(mktemp -d /tmp/ucpkit-run-all.XXXXXX)}
mkdir -p "$logs"
limit=${RUN_ALL_TIMEOUT:-1800}

names=() cmds=()
for t in "$root"/tests/frameworks/*_test.sh; do
  n=$(basename "$t" _test.sh)
  names+=("frameworks_$n") cmds+=("bash $t $build")
done
for s in dcp_verify dcp_load_verify torch_dist_verify megatron_core_load_verify hf_resume_verify; do
  names+=("$s") cmds+=("sh $root/scripts/verify/$s.sh $build")
done

selected() {
  ((${#only[@]} == 0)) && return 0
  local o
  for o in "${only[@]}"; do [[ $1 == *"$o"* ]] && return 0; done
  return 1
}

env_dir=$("$root/scripts/frameworks/setup.sh" 2>"$logs/setup.log") && env_note="pinned environment $env_dir" ||
  env_note="no pinned environment (scripts/frameworks/setup.sh failed: $(tail -1 "$logs/setup.log"))"
echo "run_all: $(date -u '+%Y-%m-%d %H:%M UTC'), build $build, $env_note, logs $logs"
rows=()   # framework|version|case|tensors|equal
t_all=$SECONDS
for i in "${!names[@]}"; do
  name=${names[$i]}
  selected "$name" || continue
  t0=$SECONDS
  # shellcheck disable=SC2086
  (cd "$root" && timeout "$limit" ${cmds[$i]}) >"$logs/$name.log" 2>&1
  rc=$?
  dt=$((SECONDS - t0))
  n_rows=0 n_bad=0
  while read -r line; do
    declare -A kv=()
    for tok in ${line#RESULT }; do [[ $tok == *=* ]] && kv[${tok%%=*}]=${tok#*=}; done
    rows+=("${kv[framework]:--}|${kv[version]:--}|${kv[case]:-$name}|${kv[tensors]:--}|${kv[equal]:-no}")
    n_rows=$((n_rows + 1))
    [[ ${kv[equal]:-no} == yes ]] || n_bad=$((n_bad + 1))
    unset kv
  done < <(grep -a '^RESULT ' "$logs/$name.log")
  if ((n_rows == 0)); then
    case $rc in
      0) eq=yes ;;
      77) eq="not run ($(grep -a -m1 'SKIP\|NOT RUN' "$logs/$name.log" | cut -c1-100))" ;;
      124) eq="no (timed out after $limit s)" ;;
      *) eq="no (exit $rc)" ;;
    esac
    rows+=("-|-|$name (no RESULT lines)|-|$eq")
  elif ((rc != 0 && n_bad == 0)); then
    rows+=("-|-|$name (exit $rc after its RESULT lines)|-|no")
  fi
  echo "run_all: $name: exit $rc in $dt s, $n_rows RESULT lines ($logs/$name.log)"
done

total=0 equal=0 bad=0 notrun=0
{
  echo "| framework | version | case | tensors compared | equal |"
  echo "|---|---|---|---:|---|"
  for r in "${rows[@]}"; do
    IFS='|' read -r fw ver cs n eq <<<"$r"
    echo "| $fw | $ver | $cs | $n | $eq |"
  done
} >"$logs/table.md"
for r in "${rows[@]}"; do
  IFS='|' read -r fw ver cs n eq <<<"$r"
  [[ $n =~ ^[0-9]+$ ]] && total=$((total + n))
  case $eq in yes) equal=$((equal + 1)) ;; "not run"*) notrun=$((notrun + 1)) ;; *) bad=$((bad + 1)) ;; esac
done
printf '\nTOTAL: %d rows, %d tensors compared; %d equal, %d not equal, %d not run (%d s)\n' \
  "${#rows[@]}" "$total" "$equal" "$bad" "$notrun" $((SECONDS - t_all)) >>"$logs/table.md"
echo
cat "$logs/table.md"
((${#rows[@]} > 0 && bad == 0 && notrun == 0))
