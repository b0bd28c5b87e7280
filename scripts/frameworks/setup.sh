#!/usr/bin/env bash
# The pinned framework environment (docs/frameworks.md): a Python virtual environment with the exact
# versions of requirements.txt, made once and kept (a new requirements.txt gives a new folder).
#
#   scripts/frameworks/setup.sh           make it when missing; prints its folder
#   scripts/frameworks/setup.sh --path    prints the folder it uses, makes nothing
#
# The folder: $UCPKIT_FRAMEWORKS_ENV, else ~/.cache/ucpkit/frameworks-<hash of requirements.txt>.
# Exit 0 with the folder on stdout once it is made (`import torch` and `import deepspeed` checked when it is
# made; later calls check that its python finds torch); else 1 and one line on stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req=$here/requirements.txt
hash=$(sha256sum "$req" | cut -c1-12)
env_dir=${UCPKIT_FRAMEWORKS_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ucpkit/frameworks-$hash}
if [[ "${1:-}" == "--path" ]]; then echo "$env_dir"; exit 0; fi
# Made and complete: its python runs and finds torch (without importing it: every framework check calls this
# script, and `import torch` was 3-7 s of each on a loaded 2-core CI machine). The imports are checked once,
# when the environment is made.
check() { "$env_dir/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' >/dev/null 2>&1; }
imports() { "$env_dir/bin/python" -c 'import torch, torch.distributed.checkpoint' >/dev/null 2>&1; }
if [[ -f "$env_dir/.complete" ]] && check; then echo "$env_dir"; exit 0; fi
mkdir -p "$(dirname "$env_dir")"
# One maker at a time (tests run in parallel); the others wait, then find it made.
exec 9>"$env_dir.lock"
flock 9
if [[ -f "$env_dir/.complete" ]] && check; then echo "$env_dir"; exit 0; fi
python=$(command -v python3.11 || command -v python3)
staged=$env_dir.partial-$$
trap 'rm -rf "$staged"' EXIT
rm -rf "$env_dir.partial-"*  # what a killed run left
"$python" -m venv "$staged" >&2
# Lines marked `# sdist` (DeepSpeed) are built from source in a second step, against what the first installed.
grep -v '#[[:space:]]*sdist' "$req" >"$staged/requirements-wheels.txt"
"$staged/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$staged/requirements-wheels.txt" >&2 || {
  echo "scripts/frameworks/setup.sh: pip install of $req failed (is PyPI reachable?)" >&2; exit 1; }
mapfile -t sdists < <(sed -n 's/^\([^#[:space:]]\+\)[[:space:]]*#[[:space:]]*sdist.*/\1/p' "$req")
if ((${#sdists[@]})); then
  # DeepSpeed's setup.py imports torch (--no-build-isolation) and records the accelerator it finds
  # (DS_ACCELERATOR=cpu: no GPU here) and the ops it compiled (DS_BUILD_OPS=0: none, they are JIT-built on use);
  # --no-cache-dir: a wheel pip cached from a build with other DS_* settings is not reused.
  DS_ACCELERATOR=cpu DS_BUILD_OPS=0 "$staged/bin/pip" install --quiet --disable-pip-version-check --no-deps \
    --no-build-isolation --no-cache-dir "${sdists[@]}" >"$staged/sdist-build.log" 2>&1 || {
    tail -20 "$staged/sdist-build.log" >&2
    echo "scripts/frameworks/setup.sh: building ${sdists[*]} failed" >&2; exit 1; }
  DS_ACCELERATOR=cpu "$staged/bin/python" -c 'import deepspeed' >&2 || {
    echo "scripts/frameworks/setup.sh: import deepspeed fails in the new environment" >&2; exit 1; }
fi
# The venv's scripts name its folder: made under the final name's sibling, they are fixed by
# recreating the venv in place after the move (python -m venv on an existing folder keeps packages).
rm -rf "$env_dir"
mv "$staged" "$env_dir"
"$python" -m venv "$env_dir" >&2
imports || { echo "scripts/frameworks/setup.sh: $env_dir: import torch fails" >&2; exit 1; }
touch "$env_dir/.complete"
echo "$env_dir"
