#!/usr/bin/env bash
# Install test (issue 28 item 6): `cmake --install` into a temporary prefix, then, with the build
# and source trees made unreachable (a private mount namespace with empty tmpfs mounted over them)
# and the CUDA libraries hidden the same way (a machine without CUDA), every installed tool's
# --version and a small conversion (ucp-union of a generated checkpoint, then ucp-load, relative paths
# from the work folder; a Hugging Face folder into DeepSpeed and back) run from the prefix; `ucp-load --device cuda` fails with one error line,
# exit 1. readelf: no tool and not libucpkit has libcudart/libnccl among its NEEDED entries, and no
# RUNPATH/RPATH names the build or source tree. The outputs are then checked against the fixture
# with the tests' own checkers against the generator's truth (outside the namespace). Needs root
# (unshare -m, mount) and Debian's Python torch (the generator).
# Usage: install_test.sh <build_dir> <tool>...
. "$(dirname "$0")/common.sh"
build=$(cd "$1" && pwd)
shift
tools=("$@")
version=$(sed -n 's/^#define UCPKIT_VERSION "\(.*\)"$/\1/p' "$build/lib/ucpkit/version.h")
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || fail "cmake --install: $(tail -3 "$work/install.log")"

# What a prefix install must hold.
for t in "${tools[@]}"; do
  [ -x "$prefix/bin/$t" ] || fail "$prefix/bin/$t not installed"
  head -1 "$prefix/share/man/man1/$t.1" 2>/dev/null | grep -q '^\.TH' || fail "man page share/man/man1/$t.1 missing"
done
lib=$prefix/lib
[ -d "$lib" ] || lib=$(dirname "$(find "$prefix" -name libucpkit.so | head -1)")
[ -f "$lib/libucpkit.so" ] || fail "libucpkit.so not installed"
[ -f "$prefix/include/ucpkit/core/error.h" ] || fail "headers not installed under include/ucpkit"
[ -f "$prefix/share/doc/ucpkit/commands.md" ] || fail "docs not installed under share/doc/ucpkit"
[ -f "$prefix/share/ucpkit/patterns/llama-gqa.json" ] || fail "pattern files not installed under share/ucpkit/patterns"
for f in common.sh elastic_resume.sbatch between_runs.sbatch pec_checkpoint.sbatch prelaunch_placement.sbatch; do
  [ -f "$prefix/share/ucpkit/examples/slurm/$f" ] || fail "Slurm job script $f not installed under share/ucpkit/examples/slurm"
done
[ -x "$prefix/share/ucpkit/examples/slurm/elastic_resume.sbatch" ] || fail "installed job scripts lost their execute bit"

# Dynamic sections: no CUDA at start, no path into the trees.
for f in "$prefix"/bin/* "$lib"/lib*.so; do
  dyn=$(readelf -d "$f") || fail "readelf -d $f"
  if [[ $(basename "$f") != libucpkit_gpu.so ]] && grep -Eq 'NEEDED.*(libcudart|libnccl)' <<<"$dyn"; then
    fail "$f needs CUDA at start: $(grep -E 'libcudart|libnccl' <<<"$dyn" | tr -s ' ')"
  fi
  if grep -E 'R(UN)?PATH' <<<"$dyn" | grep -Fq -e "$build" -e "$src"; then
    fail "$f: $(grep -E 'R(UN)?PATH' <<<"$dyn" | tr -s ' ') names the build or source tree"
  fi
done

# Input the namespace can still see: a small checkpoint with its ground truth (truth/).
/usr/bin/python3 "$src/tests/generator/gen_ds_checkpoint.py" --output "$work/ck" --model gpt --tp 2 --pp 1 --dp 2 --zero 1 \
  --dtype bf16 --layers 2 --hidden 32 --heads 4 --ffn 64 --vocab 96 --seq 16 --seed 3 >/dev/null

# A tiny Hugging Face Llama (config.json + model.safetensors, float32, every value distinct), written with Python's
# standard library: the family maps it needs are compiled into the installed library.
/usr/bin/python3 - "$work/hf" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
os.makedirs(d)
shapes = {"model.embed_tokens.weight": [16, 8], "model.norm.weight": [8], "lm_head.weight": [16, 8]}
for p, s in {"self_attn.q_proj": [8, 8], "self_attn.k_proj": [4, 8], "self_attn.v_proj": [4, 8], "self_attn.o_proj": [8, 8],
             "mlp.gate_proj": [16, 8], "mlp.up_proj": [16, 8], "mlp.down_proj": [8, 16], "input_layernorm": [8],
             "post_attention_layernorm": [8]}.items():
    shapes["model.layers.0." + p + ".weight"] = s
header, data, k = {}, b"", 0
for name, shape in sorted(shapes.items()):
    n = 1
    for x in shape:
        n *= x
    values = struct.pack("<%df" % n, *[(k * 1000 + i) / 4096.0 for i in range(n)])
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(values)]}
    data, k = data + values, k + 1
h = json.dumps(header).encode()
open(os.path.join(d, "model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + data)
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
           "max_position_embeddings": 8, "vocab_size": 16, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "dtype": "float32"}, open(os.path.join(d, "config.json"), "w"))
PY

# The run from the prefix, build and source trees (and CUDA) hidden. $prefix and $work are outside them.
cat >"$work/run.sh" <<'INNER'
set -euo pipefail
prefix=$1 build=$2 src=$3 version=$4
shift 4
fail() { echo "install_test: FAIL (installed tools): $*" >&2; exit 1; }
for d in "$src" "$build" /usr/local/cuda; do
  if [ -d "$d" ]; then mount -t tmpfs -o size=1m,ro none "$d" || fail "cannot mount tmpfs over $d"; fi
done
[ -z "$(ls -A "$build" 2>/dev/null)" ] || fail "build tree $build still reachable"
[ ! -e /usr/local/cuda/lib ] || fail "CUDA libraries still reachable"
cd "$(dirname "$prefix")"
export PATH=$prefix/bin:/usr/bin:/bin
for t in "$@"; do
  out=$("$t" --version 2>&1) || fail "$t --version: exit $?: $out"
  grep -q "^$t (ucpkit) $version\$" <<<"$out" || fail "$t --version: first line is not '$t (ucpkit) $version': $out"
  grep -q '^commit ' <<<"$out" || fail "$t --version names no git commit: $out"
  grep -q '^build ' <<<"$out" || fail "$t --version names no build options: $out"
done
ucp-union -q --input ck --output universal || fail "ucp-union --input ck --output universal: exit $?"
ucp-load -q --input universal --output target --tp 1 --pp 1 --dp 1 --zero-stage 1 || fail "ucp-load: exit $?"
mkdir back
ucp-union -q --input target --output back/universal || fail "ucp-union of the ucp-load output: exit $?"
set +e
err=$(ucp-load --input universal --device cuda --tp 1 --pp 1 --dp 1 --zero-stage 1 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "ucp-load --device cuda without CUDA libraries: exit $rc (want 1): $err"
[ "$(wc -l <<<"$err")" -eq 1 ] && grep -q '^ucp-load: error: no GPU: ' <<<"$err" ||
  fail "ucp-load --device cuda without CUDA libraries: not one error line: $err"
echo "install_test: --device cuda without CUDA: $err"
# A Hugging Face folder into the DeepSpeed engine's form and back; both compare equal to it.
ucp-load -q --input hf --output hf_ds --dp 2 --zero-stage 3 2>/dev/null || fail "ucp-load --input hf: exit $?"
ucp-load -q --input hf_ds --format hf --output hf_back 2>/dev/null || fail "ucp-load --format hf: exit $?"
ucp-diff -q hf hf_ds 2>/dev/null || fail "ucp-diff hf hf_ds: exit $?"
ucp-diff -q hf hf_back 2>/dev/null || fail "ucp-diff hf hf_back: exit $?"
echo "install_test: a Hugging Face folder -> DeepSpeed ZeRO-3 -> Hugging Face from the prefix: equal"
# The same folder through Megatron-Core torch_dist, both steps read in one pass, options left out.
ucp-load -q --input hf --format torch_dist --output hf_td 2>/dev/null || fail "ucp-load --input hf --format torch_dist: exit $?"
ucp-load -q --input hf_td --format hf --output hf_td_back 2>/dev/null || fail "ucp-load --input hf_td --format hf: exit $?"
ucp-diff -q hf hf_td_back 2>/dev/null || fail "ucp-diff hf hf_td_back: exit $?"
echo "install_test: a Hugging Face folder -> torch_dist -> Hugging Face from the prefix: equal"
INNER
unshare -m --propagation private bash "$work/run.sh" "$prefix" "$build" "$src" "$version" "${tools[@]}" ||
  fail "the run from the prefix failed (above)"

# The conversions' results, checked with the test suite's own checkers.
/usr/bin/python3 "$src/tests/to_universal/check_universal.py" "$work/universal" "$work/ck" >"$work/check.log" 2>&1 ||
  fail "universal checkpoint from the installed ucp-union differs from the generator's truth: $(tail -3 "$work/check.log")"
/usr/bin/python3 "$src/tests/reshard/same_universal.py" "$work/universal" "$work/back/universal" ||
  fail "ucp-load from the prefix did not keep the atomic tensors"
echo "install_test: ok (${#tools[@]} tools from $prefix, build tree unreachable)"
