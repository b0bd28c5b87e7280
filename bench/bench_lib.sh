# Helpers the bench_*.sh scripts source (not run on its own). They use $work (the script's work folder).
# room BYTES: stops unless writing BYTES more leaves 8 GB free on $work's file system.
room() {
  local avail; avail=$(df -B1 --output=avail "$work" | tail -1)
  if [ $((avail - $1)) -lt 8000000000 ]; then echo "stop: $avail bytes free, $1 to write would leave under 8 GB" >&2; exit 1; fi
}
# measure CMD...: runs CMD under GNU time; prints "<wall s> <cpu user+sys s> <peak RSS KiB>" (exits on failure).
measure() {
  /usr/bin/time -f "%e %U %S %M" -o "$work/time.txt" "$@" >/dev/null 2>"$work/err.txt" || { cat "$work/err.txt" >&2; exit 1; }
  awk '{printf "%s %.2f %s\n", $1, $2 + $3, $4}' "$work/time.txt"
}
# add KEY WALL CPU RSS: appends one round's figures to the arrays t, c, m (declared here).
declare -A t c m
add() { t[$1]+="$2 "; c[$1]+="$3 "; m[$1]+="$4 "; }
# med: the median of the numbers on standard input (spaces or lines).
med() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
