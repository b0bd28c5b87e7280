#!/bin/sh
# Megatron-DeepSpeed output of a Hugging Face folder judged by Megatron-DeepSpeed's own code (issue 49; outside CI:
# Megatron-DeepSpeed is not on PyPI; about 1 minute on 2 cores). transformers' save_pretrained writes two fp32 Llama
# models (4 layers, hidden 32, 4 heads and 4 key/value heads: grouped-query attention does not run at the judged
# commit, mds_hf_verify.py), untied and tied; `ucp-load --input <folder> --to-names megatron-deepspeed --tp T --pp P
# --dp 1` writes each at TP x PP in (1, 1), (2, 1), (1, 2), (2, 2); Megatron-DeepSpeed's setup_model_and_optimizer and
# load_checkpoint (--finetune) read it on T x P gloo CPU ranks and the DeepSpeed pipeline engine's loss of one batch
# must equal transformers' within 1e-5 (mds_hf_verify.py); a Mixtral (4 experts, top 2) as native DeepSpeed MoE at
# EP 2 x DP 2: every tensor Megatron-DeepSpeed loads on each rank equal to the folder's. Run as users run it:
# relative paths, from the work folder.
#   scripts/verify/mds_hf_verify.sh [BUILD]      # BUILD: a build folder or install prefix with bin/ (default build/)
# MDS_GIT: a (bare) git repository of github:deepspeedai/Megatron-DeepSpeed (default: the fetched mirror at
# /work/.mirror/deepspeedai+Megatron-DeepSpeed/repo); MDS_COMMIT (default 4efb479). Needs PyPI for `six`.
# Results: one `RESULT framework=megatron-deepspeed ...` line per case; exit 1 if any differs, 77 if it cannot run.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
MDS_GIT=${MDS_GIT:-/work/.mirror/deepspeedai+Megatron-DeepSpeed/repo}
MDS_COMMIT=${MDS_COMMIT:-4efb479}
[ -x "$BUILD/bin/ucp-load" ] || { echo "SKIP: no $BUILD/bin/ucp-load"; exit 77; }
git --git-dir="$MDS_GIT" cat-file -e "$MDS_COMMIT^{commit}" 2>/dev/null ||
  { echo "NOT RUN: no Megatron-DeepSpeed $MDS_COMMIT in MDS_GIT=$MDS_GIT"; exit 77; }
. "$ROOT/scripts/frameworks/env.sh"
frameworks_python "$ROOT"
WORK=$(mktemp -d)
if [ -n "${KEEP:-}" ]; then echo "work folder kept: $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
mkdir -p "$WORK/src" "$WORK/deps/torchvision"
git --git-dir="$MDS_GIT" archive "$MDS_COMMIT" megatron tools pretrain_gpt.py | tar -x -C "$WORK/src"
"$FRAMEWORKS_PY" -m pip install -q --target "$WORK/deps" six > /dev/null 2>&1 ||
  { echo "NOT RUN: pip install six (PyPI) failed"; exit 77; }
# Megatron-DeepSpeed's training module imports its vision datasets (torchvision); a stand-in module: never called.
cat > "$WORK/deps/torchvision/__init__.py" <<'PY'
import sys, types
class _Any:
    def __getattr__(self, name): return _Any()
    def __call__(self, *a, **k): return _Any()
def __getattr__(name): return _Any()
for _sub in ("transforms", "datasets", "models", "io", "ops"):
    _m = types.ModuleType("torchvision." + _sub)
    _m.__getattr__ = lambda name: _Any()
    sys.modules["torchvision." + _sub] = _m
PY
cd "$WORK"
PYTHONWARNINGS=ignore "$FRAMEWORKS_PY" - <<'PY' > make.log 2>&1 || { cat make.log; exit 1; }
import torch
from transformers import LlamaConfig, LlamaForCausalLM  # models/llama/configuration_llama.py (transformers 5)
from transformers import MixtralConfig, MixtralForCausalLM  # models/mixtral/configuration_mixtral.py
torch.manual_seed(5)
MixtralForCausalLM(MixtralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=4, num_local_experts=4, num_experts_per_tok=2, vocab_size=128,
                                 max_position_embeddings=64, rms_norm_eps=1e-5)).to(torch.float32).save_pretrained("mixtral")
for name, tied in (("llama", False), ("llama_tied", True)):
    torch.manual_seed(3)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=128, max_position_embeddings=64, rms_norm_eps=1e-5,
                      tie_word_embeddings=tied)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(name)
PY
rc=0 port=29790
for name in llama llama_tied; do
  for layout in "1 1" "2 1" "1 2" "2 2"; do
    set -- $layout
    out="$name.tp$1pp$2"
    "$BUILD/bin/ucp-load" -q --input "$name" --to-names megatron-deepspeed --tp "$1" --pp "$2" --dp 1 --output "$out" 2> ucp.log ||
      { cat ucp.log; echo "FAIL: ucp-load of $name at TP $1 x PP $2"; rc=1; continue; }
    port=$((port + 1))
    MDS_SRC="$WORK/src" PYTHONPATH="$WORK/deps" PYTHONWARNINGS=ignore timeout 600 "$FRAMEWORKS_PY" -m torch.distributed.run \
      --nproc_per_node $(($1 * $2)) --master_port "$port" "$ROOT/scripts/verify/mds_hf_verify.py" "$out" "$name" "$1" "$2" \
      > "$out.log" 2>&1
    case_rc=$?
    grep '^RESULT' "$out.log" || { tail -20 "$out.log"; echo "FAIL: $out: no result"; }
    [ "$case_rc" -eq 0 ] || rc=1
  done
done
# Mixtral as native DeepSpeed MoE at EP 2 x DP 2 (2 ranks): what Megatron-DeepSpeed loads on each rank against the
# folder's tensors (mds_hf_verify.py: its GPTModel's rotary path does not run at 4efb479).
"$BUILD/bin/ucp-load" -q --input mixtral --to-names megatron-deepspeed --ep 2 --dp 2 --output mixtral.ep2dp2 2> ucp.log ||
  { cat ucp.log; echo "FAIL: ucp-load of mixtral at EP 2 x DP 2"; rc=1; }
if [ -d mixtral.ep2dp2 ]; then
  EP=2 MDS_SRC="$WORK/src" PYTHONPATH="$WORK/deps" PYTHONWARNINGS=ignore timeout 600 "$FRAMEWORKS_PY" -m torch.distributed.run \
    --nproc_per_node 2 --master_port $((port + 1)) "$ROOT/scripts/verify/mds_hf_verify.py" mixtral.ep2dp2 mixtral 1 1 \
    > mixtral.log 2>&1 || rc=1
  grep '^RESULT' mixtral.log || { tail -20 mixtral.log; echo "FAIL: mixtral.ep2dp2: no result"; rc=1; }
fi
exit "$rc"
