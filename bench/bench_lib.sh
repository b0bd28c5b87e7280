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
# floor_data IN BYTES OUT [direct]: the floor of a conversion: every data byte of the files under IN read once (holes
# skipped: a save's zero moments are not data), then BYTES written once into the file OUT and flushed; OUT removed.
# With "direct" the bytes are written with O_DIRECT in 4 MiB blocks (no copy into the page cache: on this VM kind the
# kernel's copy costs more than the disk), for writers that do the same.
floor_data() {
  python3 - "$1" <<'PY' || return 1
import os, sys
buf = memoryview(bytearray(8 << 20))
for top, _, names in os.walk(sys.argv[1]):
    for name in names:
        fd = os.open(os.path.join(top, name), os.O_RDONLY)
        pos, end = 0, os.fstat(fd).st_size
        while pos < end:
            try:
                pos = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # only a hole is left
                break
            stop = os.lseek(fd, pos, os.SEEK_HOLE)
            os.lseek(fd, pos, os.SEEK_SET)
            while pos < stop:
                n = os.readv(fd, [buf[:min(len(buf), stop - pos)]])
                if n <= 0:
                    break
                pos += n
        os.close(fd)
PY
  if [ "${4:-}" = direct ]; then
    dd if=/dev/zero of="$3" bs=4M count=$(( ($2 + 4194303) / 4194304 )) oflag=direct status=none && sync -f "$3" && rm -f "$3"
  else
    dd if=/dev/zero of="$3" bs=1M count=$(( ($2 + 1048575) / 1048576 )) status=none && sync -f "$3" && rm -f "$3"
  fi
}
