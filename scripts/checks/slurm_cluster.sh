#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for the job-script tests (Debian's slurm-wlm + munge):
#   scripts/checks/slurm_cluster.sh start DIR   writes DIR/slurm.conf, starts munged, slurmctld and slurmd,
#                                        waits until the node is idle; prints `export SLURM_CONF=...`
#   scripts/checks/slurm_cluster.sh stop DIR    stops the daemons started from DIR (and munged if it started it)
# Runs as root (the daemons, and apt-get when slurm-wlm / munge are missing). Everything lives under DIR
# (state, spool, logs, pid files); ports 16817/16818 so a system Slurm, if any, is not disturbed.
# Fails with the reason (the daemon's log) when a daemon cannot start: CI must not skip silently.
set -euo pipefail
cmd=${1:?usage: cluster.sh start|stop DIR}
dir=$(mkdir -p "${2:?usage: cluster.sh start|stop DIR}" && cd "$2" && pwd)
conf=$dir/slurm.conf

die() { echo "slurm cluster: $*" >&2; exit 1; }
pid_of() { [ -s "$1" ] && cat "$1"; }

stop() {
  for d in slurmd slurmctld; do
    local p; p=$(pid_of "$dir/$d.pid" || true)
    if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
      kill "$p"
      for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$p" 2>/dev/null || true
    fi
    rm -f "$dir/$d.pid"
  done
  if [ -f "$dir/munged.started" ]; then
    pkill -x munged 2>/dev/null || true
    rm -f "$dir/munged.started"
  fi
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || die "unknown command $cmd (start|stop)"
[ "$(id -u)" -eq 0 ] || die "needs root (starts slurmctld/slurmd as root)"

missing=()
for p in slurmctld slurmd slurm-client munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "slurm cluster: installing ${missing[*]}" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

stop  # leftovers of an earlier run from the same folder (before munged: stop() ends a munged it started)

# munge: one daemon per machine; start it if none answers.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  [ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
  chown -R munge:munge /etc/munge; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge; chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged || die "munged did not start"
  touch "$dir/munged.started"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munge does not answer"
fi

for port in 16817 16818; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    die "port $port is in use (another slurmctld/slurmd of an earlier test still running? pgrep -a slurm)"
  fi
done
host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
mkdir -p "$dir/state" "$dir/spool"
# MinJobAge=5: a finished job's record stays at least 5 s, long enough for test_slurm.sh's poll of its state
# (every 0.1 s) to read its exit code. (With `sbatch --wait`, which sleeps 2 s before its first poll and
# quadruples the pause while it is below MinJobAge / 2, src/sbatch/sbatch.c _job_wait, the default 300 kept
# a 3 s job waiting 10 s and an 11 s one 42 s.)
cat > "$conf" <<CONF
ClusterName=ucpkit
SlurmctldHost=$host
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
LaunchParameters=use_interactive_step
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=30
MinJobAge=5
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$conf
slurmctld -f "$conf" -i || die "slurmctld did not start: $(tail -5 "$dir/slurmctld.log" 2>/dev/null)"
slurmd -f "$conf" || die "slurmd did not start: $(tail -5 "$dir/slurmd.log" 2>/dev/null)"
sleep 0.5
for d in slurmctld slurmd; do
  p=$(pid_of "$dir/$d.pid" || true)
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null || die "$d exited: $(grep -i error "$dir/$d.log" | tail -3)"
done
for _ in $(seq 100); do
  state=$(sinfo -h -N -o %T 2>/dev/null | head -1 || true)
  case "$state" in idle|mixed|allocated) break ;; esac
  sleep 0.2
done
case "${state:-}" in
  idle|mixed|allocated) ;;
  *) die "node not ready (state '${state:-none}'): $(tail -3 "$dir/slurmctld.log") $(tail -3 "$dir/slurmd.log")" ;;
esac
echo "export SLURM_CONF=$conf"
