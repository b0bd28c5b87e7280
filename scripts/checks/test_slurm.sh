#!/usr/bin/env bash
# The example job scripts (examples/slurm/) under a real Slurm: starts a one-node cluster
# (scripts/checks/slurm_cluster.sh: Debian's slurm-wlm + munge, installed if missing), submits each example
# with sbatch on small generated checkpoints, waits, checks the results against independent truth,
# kills a conversion with scancel and resubmits, then stops the daemons. Exit 0 iff everything held.
# Needs root. Run by ctest (test `slurm_examples`) and by hand:
#   scripts/checks/test_slurm.sh [build_dir] [work_dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
work=${2:-$(mktemp -d /tmp/ucpkit-slurm.XXXXXX)}
rm -rf "$work"; mkdir -p "$work"
# The checks in Python through the tests' warm python (tests/support/pywarm.py: torch imported once).
py="/usr/bin/python3 -S $root/tests/support/pywarm.py"
ex=$root/examples/slurm
export UCPKIT_BIN=$build/bin OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
failures=0
step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
cleanup() { "$root/scripts/checks/slurm_cluster.sh" stop "$work/cluster" >/dev/null 2>&1 || true; }
trap cleanup EXIT

step "starting a one-node Slurm cluster in $work/cluster"
eval "$("$root/scripts/checks/slurm_cluster.sh" start "$work/cluster")"
sinfo
# sbatch, a poll of the job's state every 0.1 s until it ends, then its exit code and output (the job's log is
# its own output file). Not `sbatch --wait`: it sleeps 2 s before each poll (src/sbatch/sbatch.c _job_wait),
# 2-4 s of waiting per job, a third of this test's time. A finished job's record stays MinJobAge (5 s,
# slurm_cluster.sh) seconds, 50 polls.
submit() {  # NAME SCRIPT [sbatch args...]: runs the job to its end; its exit code
  local name=$1 script=$2 jid state="" line="" unseen=0
  shift 2
  jid=$(sbatch --parsable --chdir "$work" --output "$work/$name.out" "$@" "$script") || return 1
  for _ in $(seq 6000); do
    line=$(scontrol -o show job "$jid" 2>/dev/null) || true
    state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
    case $state in
      PENDING|RUNNING|COMPLETING|CONFIGURING|SUSPENDED) sleep 0.1 ;;
      "") unseen=$((unseen + 1)); ((unseen < 20)) || break; sleep 0.1 ;;  # not answered for 2 s: gone
      *) break ;;
    esac
  done
  sed "s/^/  [$name] /" "$work/$name.out" 2>/dev/null || true
  [[ $state == COMPLETED ]] && return 0
  local code=$(sed -n 's/.* ExitCode=\([0-9]*\):.*/\1/p' <<<"$line")
  echo "  [$name] job $jid ended $state, exit code ${code:-unknown}"
  [[ -n $code && $code != 0 ]] && return "$code"
  return 1
}

step "generating checkpoints"
$py - "$root" "$work" <<'PY'
import os, shutil, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "generator"))
import dsgen
work = sys.argv[2]
# A dense GPT run saved at DP 2 (ZeRO-1, bf16), with ground truth of its universal form.
dsgen.generate(os.path.join(work, "gpt"), dsgen.ModelConfig(family="gpt", layers=2, hidden=32, heads=4, ffn=128,
               vocab=96, seq=16), dsgen.Layout(tp=1, pp=1, dp=2, zero=1, dtype="bf16", step=200, seed=7))
# A native-MoE run with two checkpoint tags in one save folder (as DeepSpeed writes them).
cfg = dsgen.ModelConfig(family="dsmoe", layers=4, hidden=32, heads=4, kv_heads=4, ffn=64, vocab=128, seq=16, experts=4)
moe = os.path.join(work, "moe")
for i, step in enumerate((10, 20)):
    tmp = os.path.join(work, f"moe_tmp{step}")
    dsgen.generate(tmp, cfg, dsgen.Layout(dp=4, ep=2, zero=1, dtype="bf16", step=step, seed=100 + i), truth=False)
    os.makedirs(moe, exist_ok=True)
    shutil.move(os.path.join(tmp, f"global_step{step}"), os.path.join(moe, f"global_step{step}"))
    shutil.rmtree(tmp)
with open(os.path.join(moe, "latest"), "w") as f:
    f.write("global_step20")
# A native-MoE run saved at EP 2 in fp16 (issue 28: an elastic resume must keep fp16 and may change EP).
dsgen.generate(os.path.join(work, "moe16"), cfg, dsgen.Layout(dp=4, ep=2, zero=1, dtype="fp16", step=30, seed=9),
               truth=False)
PY
(cd "$work/gpt" && find . -type f -print0 | sort -z | xargs -0 sha256sum) > "$work/gpt.sha256"

step "1. elastic resume: DP 2 -> 3, interrupted by scancel, then resubmitted"
export CKPT_DIR=$work/gpt NEW_DP=3 NEW_TP=1 NEW_PP=1 ZERO_STAGE=1
# Pause the first conversion step once its output is staged (test hook), then scancel the job.
jid=$(UCPKIT_TEST_PAUSE_STAGED=1 sbatch --parsable --chdir "$work" --output "$work/elastic-killed.out" \
      --export=ALL,UCPKIT_TEST_PAUSE_STAGED=1 "$ex/elastic_resume.sbatch")
for _ in $(seq 3000); do  # up to 5 minutes: ctest runs other tests beside this one
  find "$work" "$work/gpt" -maxdepth 1 -name '.*-tmp-*' 2>/dev/null | grep -q . && break
  sleep 0.1
done
sleep 0.5
scancel "$jid"
for _ in $(seq 900); do squeue -h -j "$jid" 2>/dev/null | grep -q . || break; sleep 0.1; done
sed "s/^/  [elastic-killed] /" "$work/elastic-killed.out"
grep -q "ucp-union: INTERRUPTED" "$work/elastic-killed.out" || fail "the cancelled job did not report the interruption"
[ ! -e "$work/gpt_dp3" ] || fail "a cancelled conversion left $work/gpt_dp3"
! find "$work" "$work/gpt" -maxdepth 1 -name '.*-tmp-*' | grep . || fail "a cancelled conversion left its staging folder"
(cd "$work/gpt" && sha256sum --quiet -c "$work/gpt.sha256") || fail "the source checkpoint changed"
submit elastic "$ex/elastic_resume.sbatch" || fail "elastic resume exited $?"
[ -f "$work/gpt_dp3/latest" ] || fail "no converted checkpoint"
if [ -f "$work/gpt_dp3/latest" ]; then
  "$UCPKIT_BIN/ucp-union" -q --input "$work/gpt_dp3" --output "$work/gpt_dp3_universal" &&
    $py "$root/tests/reshard/same_universal.py" "$work/gpt/global_step200_universal" "$work/gpt_dp3_universal" ||
    fail "the DP 3 checkpoint is not the source's model and optimizer state bit for bit"
  $py "$root/tests/to_universal/check_universal.py" "$work/gpt/global_step200_universal" "$work/gpt" ||
    fail "the universal checkpoint differs from the generator's truth"
  ls "$work/gpt_dp3/global_step200" | grep -c zero_pp_rank | grep -qx 3 || fail "expected 3 ZeRO shards"
fi
submit elastic-again "$ex/elastic_resume.sbatch" || fail "re-running elastic resume exited $?"
grep -q "already holds this layout" "$work/elastic-again.out" || fail "a re-run did not reuse the finished conversion"
# Resubmitted with another layout into the same folder: converted again, never "reused". NEW_DP unset:
# DP from the allocation (SLURM_NTASKS = 2 tasks) at TP 2: DP 1.
(unset NEW_DP; NEW_TP=2 OUT_DIR=$work/gpt_dp3 submit elastic-tp2 "$ex/elastic_resume.sbatch") ||
  fail "elastic resume with another layout exited $?"
grep -q "holds another layout" "$work/elastic-tp2.out" || fail "a layout change was not logged"
! grep -q "already holds this layout" "$work/elastic-tp2.out" || fail "a folder of another layout was reused"
grep -q "DP = world size 2 (SLURM_NTASKS)" "$work/elastic-tp2.out" || fail "DP was not taken from the allocation"
$py -c "import json,sys; r=json.load(open(sys.argv[1])); assert (r['tp'], r['dp']) == (2, 1), r" \
  "$work/gpt_dp3/ucpkit_layout.json" || fail "the layout record is not TP 2 DP 1"
ls "$work/gpt_dp3/global_step200" | grep -c '^mp_rank_' | grep -qx 2 || fail "expected 2 TP model files"
unset CKPT_DIR NEW_DP NEW_TP NEW_PP ZERO_STAGE

step "1b. elastic resume of a native-MoE fp16 run: EP 2 -> 4, precision and the rest from the source"
CKPT_DIR=$work/moe16 NEW_EP=4 WORLD_SIZE=4 submit elastic-moe "$ex/elastic_resume.sbatch" ||
  fail "native-MoE elastic resume exited $?"
out=$work/moe16_world4/global_step30
grep -q "dtype fp16" "$work/elastic-moe.out" || fail "the job log does not say fp16 was taken from the source"
[ "$(ls "$out" | grep -c '^expp_rank_')" = 4 ] || fail "expected EP 4 (4 expp_rank files) in $out"
[ "$(ls "$out" | grep -c '^zero_pp_rank_')" = 4 ] || fail "expected 4 fp16 ZeRO shards (zero_pp_rank_*, no bf16_) in $out"
[ "$($py "$root/tests/reshard/target_dtypes.py" "$out")" = torch.float16 ] || fail "the weights in $out are not fp16"
"$UCPKIT_BIN/ucp-union" -q --input "$work/moe16_world4" --output "$work/moe16_world4_universal" &&
  $py "$root/tests/reshard/same_universal.py" "$work/moe16/global_step30_universal" "$work/moe16_world4_universal" ||
  fail "the EP 4 checkpoint is not the source's model and optimizer state bit for bit"

step "2. between runs: universal + safetensors under mpirun -np 2"
rm -rf "$work/gpt/global_step200_universal"
CKPT_DIR=$work/gpt submit between "$ex/between_runs.sbatch" || fail "between-runs exited $?"
grep -q "mpirun -np 2" "$work/between.out" || fail "the conversion did not run on both tasks"
$py "$root/tests/to_universal/check_universal.py" "$work/gpt/global_step200_universal" "$work/gpt" ||
  fail "universal checkpoint differs from the truth"
$py "$root/tests/reshard/read_safetensors.py" "$work/gpt/global_step200_safetensors" "$work/gpt/global_step200_universal" bf16 ||
  fail "safetensors export differs from the universal checkpoint"

step "3. partial expert checkpoints: pec-save per tag (twice: idempotent), pec-restore as the restart hook"
export CKPT_DIR=$work/moe STORE=$work/pec-store K=1
MODE=save submit pec-save "$ex/pec_checkpoint.sbatch" || fail "pec save exited $?"
MODE=save submit pec-save-again "$ex/pec_checkpoint.sbatch" || fail "pec save re-run exited $?"
[ "$(grep -c 'already in' "$work/pec-save-again.out")" = 2 ] || fail "a re-run saved a committed step again"
MODE=restore RESTORE_DIR=$work/restored submit pec-restore "$ex/pec_checkpoint.sbatch" || fail "pec restore exited $?"
$py "$root/tests/pec/verify_restore.py" "$work/restored/global_step20" "$work/restored.report.json" 2 0 \
  "10=$work/moe/global_step10" "20=$work/moe/global_step20" || fail "restored checkpoint differs from its sources"
unset CKPT_DIR STORE K

step "3b. two-level PEC: the persist agent (pec-save --watch) beside a fake trainer, then the restart hook"
# The fake trainer saves the two MoE steps into node-local CKPT_DIR as DeepSpeed does (the tag folder
# first, `latest` last), a few seconds apart; MODE=train runs the agent beside it and stops it after.
cat > "$work/fake_train.sh" <<TRAIN
#!/usr/bin/env bash
set -euo pipefail
for s in 10 20; do
  cp -r "$work/moe/global_step\$s" "$work/shm/global_step\$s"
  echo "global_step\$s" > "$work/shm/latest"
  sleep 4
done
TRAIN
chmod +x "$work/fake_train.sh"
mkdir -p "$work/shm"
export CKPT_DIR=$work/shm STORE=$work/pec-store2 K=1 TRAIN_CMD=$work/fake_train.sh
MODE=train submit pec-train "$ex/pec_checkpoint.sbatch" || fail "pec train (agent beside training) exited $?"
for s in 10 20; do
  [ -e "$(printf '%s/manifests/step-%012d.json' "$STORE" "$s")" ] || fail "the persist agent did not commit step $s"
done
MODE=restore RESTORE_DIR=$work/restored2 submit pec-restore2 "$ex/pec_checkpoint.sbatch" || fail "pec restore (agent's store) exited $?"
$py "$root/tests/pec/verify_restore.py" "$work/restored2/global_step20" "$work/restored2.report.json" 2 0 \
  "10=$work/moe/global_step10" "20=$work/moe/global_step20" || fail "checkpoint restored from the agent's store differs from its sources"
unset CKPT_DIR STORE K TRAIN_CMD

step "3c. the restart hook of docs/job-scripts.md, verbatim, with relative paths: failed training -> restore -> resume"
# The fake training command saves the two MoE steps (tag folder, then `latest`) and fails, as a run
# that lost a node does; the block starts training, the restore hook (afternotok) and the resume (afterok).
mkdir -p "$work/hook" && cd "$work/hook"
cat > train.sh <<TRAIN
#!/usr/bin/env bash
set -euo pipefail
for s in 10 20; do
  cp -r "$work/moe/global_step\$s" "shm-ckpt/global_step\$s"
  echo "global_step\$s" > shm-ckpt/latest
  sleep 4
done
echo "training: node lost" >&2
exit 1
TRAIN
chmod +x train.sh
echo '[[5, 0, 7, 1], [2, 9, 0, 4]]' > tokens.json  # tokens per [moe_layer][expert] since the last save
awk '/^```console$/ {getline l; if (l ~ /^# restart hook/) {on = 1; print l; next}} on && /^```$/ {exit} on' \
  "$root/docs/job-scripts.md" > hook.sh
grep -q afternotok hook.sh || fail "no restart hook block in docs/job-scripts.md"
hook_out=$(EX=$ex bash -euo pipefail hook.sh) || fail "the restart hook block exited $?"
echo "  [hook] $hook_out"
resume=${hook_out##* }
for _ in $(seq 1800); do squeue -h -j "$resume" 2>/dev/null | grep -q . || break; sleep 0.2; done
for f in *.out; do sed "s/^/  [$f] /" "$f"; done
cd "$work"
$py "$root/tests/pec/verify_restore.py" "$work/hook/restored/global_step20" "$work/hook/restored.report.json" 2 0 \
  "10=$work/moe/global_step10" "20=$work/moe/global_step20" || fail "the restart hook's restore differs from its sources"
$py -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['plt']['overall'] is not None, r['plt']" \
  "$work/hook/restored.report.json" || fail "the restart hook's report has no PLT although TOKENS was given"
[ "$(ls "$work/hook/restored_world4/global_step20" 2>/dev/null | grep -c '^expp_rank_')" = 4 ] ||
  fail "the resume after the restart hook did not write EP 4"

step "4. pre-launch placement from expert loads"
$py - "$work/loads.json" <<'PY'
import json, random, sys
rng = random.Random(3)
json.dump([[rng.randrange(1, 1000) for _ in range(16)] for _ in range(4)], open(sys.argv[1], "w"))
PY
LOADS=$work/loads.json PLAN=$work/plan.json GPUS_PER_NODE=4 SLOTS_PER_GPU=2 FAULT_TOLERANCE=1 NODES=4 \
  TRAIN_CMD="echo launch" submit placement "$ex/prelaunch_placement.sbatch" || fail "placement exited $?"
grep -q -- "launch --expert-placement $work/plan.json" "$work/placement.out" || fail "the plan was not handed to the launch command"
$py -c "import json,sys; p=json.load(open(sys.argv[1])); assert p, 'empty plan'" "$work/plan.json" || fail "no valid plan"

step "5. a usage error ends the job with exit code 2"
# After a rank's non-zero exit, mpirun sleeps out the SIGKILL grace common.sh sets (20 s, twice: 40 s of this
# test) although both ranks have ended; the exit code is what is checked here, so the grace is 1 s.
rc=0; OMPI_MCA_odls_base_sigkill_timeout=1 NEW_DP=0 CKPT_DIR=$work/gpt OUT_DIR=$work/bad submit bad "$ex/elastic_resume.sbatch" || rc=$?
grep -q "usage error" "$work/bad.out" || fail "a bad option was not reported as a usage error (exit $rc)"

echo
if [ $failures -ne 0 ]; then echo "test_slurm: $failures check(s) failed (work folder $work)"; exit 1; fi
echo "test_slurm: all checks passed"
cleanup
rm -rf "$work"
