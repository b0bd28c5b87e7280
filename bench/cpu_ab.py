#!/usr/bin/env python3
"""CPU time (user + sys, microseconds from the kernel's rusage) and peak RSS of one command in two builds,
run alternately ROUNDS times each (new, old, new, old, ...) so both see the same machine; prints
"new_cpu new_rss_kib old_cpu old_rss_kib" with the least CPU of each build's rounds ("-" for a build that
is missing, fails or runs past --old-timeout seconds). /usr/bin/time's 10-ms figures cannot resolve 5% of
a 0.2-s plan, and with one run each the order effect (the second run pays for the first's cache) decides.
With --instructions-over R, a case whose CPU ratio new/old exceeds R runs once more per build under
valgrind's callgrind and the line ends with "new_instructions old_instructions": instructions do not depend on
what else the machine runs, so a CPU ratio from a noisy moment can be told from a real slowdown.

Usage: cpu_ab.py --rounds N [--old-timeout S] [--old-env K=V ...] [--instructions-over R] --new CMD... [--old CMD...]"""
import argparse
import os
import subprocess
import sys


def one_run(cmd, env, timeout):
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # wait4 gives this child's own rusage (RUSAGE_CHILDREN would sum every earlier run)
        _, status, ru = _wait4_with_timeout(p, timeout)
    except TimeoutError:
        p.kill()
        os.waitpid(p.pid, 0)
        return None
    if os.waitstatus_to_exitcode(status) != 0:
        return None
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss


def _wait4_with_timeout(p, timeout):
    if timeout is None:
        return os.wait4(p.pid, 0)
    import signal

    def alarm(*_):
        raise TimeoutError()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return os.wait4(p.pid, 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def main():
    argv = sys.argv[1:]
    if "--new" not in argv:
        sys.exit(__doc__)
    i = argv.index("--new")
    j = argv.index("--old") if "--old" in argv else len(argv)
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old-timeout", type=float, default=60)
    ap.add_argument("--old-env", action="append", default=[])
    ap.add_argument("--instructions-over", type=float, default=0)
    opts = ap.parse_args(argv[:i])
    new_cmd, old_cmd = argv[i + 1:j], argv[j + 1:]
    old_env = dict(os.environ, **dict(kv.split("=", 1) for kv in opts.old_env))
    best = {"new": None, "old": None}
    old_ok = bool(old_cmd)
    for _ in range(opts.rounds):
        r = one_run(new_cmd, None, None)
        if r is None:
            sys.exit("failed: " + " ".join(new_cmd))
        if best["new"] is None or r[0] < best["new"][0]:
            best["new"] = r
        if old_ok:
            r = one_run(old_cmd, old_env, opts.old_timeout)
            if r is None:
                old_ok, best["old"] = False, None
            elif best["old"] is None or r[0] < best["old"][0]:
                best["old"] = r
    fmt = lambda b: "- -" if b is None else "%.4f %d" % b
    line = fmt(best["new"]) + " " + fmt(best["old"])
    if opts.instructions_over and best["old"] and best["new"][0] > opts.instructions_over * best["old"][0]:
        line += " %d %d" % (instructions(new_cmd, None), instructions(old_cmd, old_env))
    print(line)


def instructions(cmd, env):
    """Instructions one run executes (callgrind's "Collected"), or 0 where valgrind is missing or fails."""
    if os.path.basename(cmd[0]) == "taskset":  # valgrind would count taskset, not the program it execs
        cmd = cmd[3:]
    try:
        p = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + cmd, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        return 0
    for line in p.stderr.splitlines():
        if "Collected :" in line:
            return int(line.split("Collected :")[1])
    return 0


if __name__ == "__main__":
    main()
