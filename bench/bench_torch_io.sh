#!/usr/bin/env bash
# Benchmark (not a test): read every tensor of a ~1 GiB state dict with ucpkit's reader
# (bench_torch_io) and with Python torch.load (Debian PyTorch), same file, same run, warm page cache.
# Reports in-process time (load + touch every byte), whole-process wall time and peak RSS
# (/usr/bin/time -v) for both, and the ratios; checksums must agree.
# Usage: bench/bench_torch_io.sh [build_dir] [size_gib] [repeats]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
gib=${2:-1.0}
repeats=${3:-3}
py=/usr/bin/python3
if [ -z "${UCPKIT_BENCH_BIN:-}" ]; then
  [ -f "$build/build.ninja" ] || cmake -S "$root" -B "$build" -G Ninja >/dev/null
  ninja -C "$build" bench_torch_io >/dev/null
fi
bench="${UCPKIT_BENCH_BIN:-$build/bin/bench_torch_io}"
work=$(mktemp -d "${TMPDIR:-/tmp}/bench_torch_io.XXXXXX")
trap 'rm -rf "$work"' EXIT
file="$work/state_dict.pt"

echo "generating $gib GiB state dict..."
$py "$root/bench/torch_io/make_state_dict.py" "$file" "$gib"
size=$(stat -c %s "$file")
cat "$file" >/dev/null  # warm the page cache: both readers then measure parsing + memory traffic

field() { awk -v k="$1" '$1 == k {print $2}' "$2"; }
rss_kib() { awk -F': ' '/Maximum resident set size/ {print $2}' "$1"; }
wall_s() { awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,a,":"); s=0; for(i=1;i<=n;i++) s=s*60+a[i]; print s}' "$1"; }

run() {  # run <name> <i> <cmd...>: stdout to $work/<name>.<i>.out, time -v to .time
  local name=$1 i=$2
  shift 2
  /usr/bin/time -v "$@" >"$work/$name.$i.out" 2>"$work/$name.$i.time"
}
for i in $(seq 1 "$repeats"); do
  run cpp "$i" "$bench" "$file"
  run py "$i" $py "$root/bench/torch_io/read_torch.py" "$file"
done
run pyimport 1 $py "$root/bench/torch_io/read_torch.py" "$file" --import-only

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
stat_of() {  # stat_of <name> <in-process field | wall | rss>
  for i in $(seq 1 "$repeats"); do
    case $2 in
      wall) wall_s "$work/$1.$i.time" ;;
      rss) rss_kib "$work/$1.$i.time" ;;
      *) field "$2" "$work/$1.$i.out" ;;
    esac
  done | median
}
c_sum=$(field checksum "$work/cpp.1.out"); p_sum=$(field checksum "$work/py.1.out")
if [ "$c_sum" != "$p_sum" ]; then
  echo "checksum mismatch: ucpkit $c_sum, torch $p_sum" >&2
  exit 1
fi
c_load=$(stat_of cpp load_s); c_read=$(stat_of cpp read_s); c_tot=$(stat_of cpp total_s)
p_load=$(stat_of py load_s); p_read=$(stat_of py read_s); p_tot=$(stat_of py total_s)
c_wall=$(stat_of cpp wall); p_wall=$(stat_of py wall)
c_rss=$(stat_of cpp rss); p_rss=$(stat_of py rss); base_rss=$(rss_kib "$work/pyimport.1.time")
mib() { awk -v k="$1" 'BEGIN {printf "%.0f", k / 1024}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
cat <<REPORT
file: $(awk -v s="$size" 'BEGIN {printf "%.3f GiB", s / 2^30}') ($(field tensors "$work/cpp.1.out") tensors), checksums agree ($c_sum)
median of $repeats runs, warm page cache, $(nproc) cores
                               ucpkit     torch.load   ratio ucpkit/torch
load (s)                       $c_load      $p_load        $(ratio "$c_load" "$p_load")
touch every byte (s)           $c_read      $p_read        $(ratio "$c_read" "$p_read")
load + touch, in process (s)   $c_tot      $p_tot        $(ratio "$c_tot" "$p_tot")
whole process wall (s)         $c_wall      $p_wall        $(ratio "$c_wall" "$p_wall")
peak RSS (MiB)                 $(mib "$c_rss")       $(mib "$p_rss")          $(ratio "$c_rss" "$p_rss")
file size (MiB)                $(mib $((size / 1024)))
python + import torch RSS (MiB)            $(mib "$base_rss")
peak RSS - file size (MiB)     $(( (c_rss - size / 1024) / 1024 ))        $(( (p_rss - size / 1024) / 1024 ))
REPORT
