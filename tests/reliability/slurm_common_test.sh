#!/usr/bin/env bash
# The example job scripts stopped with exit 1 and no message when CKPT_DIR has no `latest` (issue 45):
# newest_tag's message went into the command substitution. It must reach the job log (stderr).
set -u
root=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
err=$(bash -c 'set -e; source "$1/examples/slurm/common.sh"; tag=$(newest_tag "$2"); echo "tag=$tag"' _ "$root" "$dir" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || { echo "FAIL: exit $rc, expected 1: $err"; exit 1; }
case $err in
  *"no $dir/latest"*) ;;
  *) echo "FAIL: no message naming $dir/latest: '$err'"; exit 1 ;;
esac
echo global_step7 > "$dir/latest"
out=$(bash -c 'set -e; source "$1/examples/slurm/common.sh"; newest_tag "$2"' _ "$root" "$dir")
[ "$out" = global_step7 ] || { echo "FAIL: newest_tag printed '$out'"; exit 1; }
echo "ok"
