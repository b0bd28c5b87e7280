#!/usr/bin/env bash
# Full UCP matrix: generates checkpoints in many layouts (tests/generator/gen_ds_checkpoint.py), converts
# each with ucp-union (one-step) and with ucp-extract + ucp-union (two-step, a subset), and checks
# the output bit for bit against the ground truth (tests/to_universal/check_universal.py).
# Usage: scripts/checks/test_ucp_matrix.sh [build_dir] [work_dir]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
work=${2:-$(mktemp -d /tmp/ucp-matrix.XXXXXX)}
py=/usr/bin/python3
bin=$build/bin
pass=0; fail=0; failed=()
cases=(
  "gpt-tp1:--model gpt"
  "gpt-tp2-dp3:--model gpt --tp 2 --dp 3"
  "gpt-tp4-dp2-zero2-fp16:--model gpt --tp 4 --dp 2 --zero 2 --dtype fp16"
  "gpt-tp8-dp2-fp32:--model gpt --tp 8 --dp 2 --dtype fp32 --hidden 64 --ffn 128 --heads 8"
  "gpt-untied-tp2-dp5:--model gpt --untied --tp 2 --dp 5"
  "gpt-swiglu-tp2-dp2:--model gpt --swiglu --tp 2 --dp 2"
  "gpt-untied-swiglu-tp4-dp3-zero2:--model gpt --untied --swiglu --tp 4 --dp 3 --zero 2"
  "gpt-pp2-tp2-dp3:--model gpt --tp 2 --pp 2 --dp 3"
  "gpt-pp4-tp1-dp2-bf16opt:--model gpt --pp 4 --dp 2 --bf16-optimizer"
  "gpt-pp8-tp8-dp5:--model gpt --tp 8 --pp 8 --layers 8 --dp 5 --vocab 50 --hidden 16 --ffn 32 --heads 8"
  "gpt-pp2-untied-swiglu-tp2-dp2:--model gpt --pp 2 --untied --swiglu --tp 2 --dp 2"
  "gpt-dp16-tiny:--model gpt --dp 16 --hidden 8 --ffn 16 --heads 2 --vocab 10 --seq 4 --layers 2"
  "gpt-dp16-odd-padding-ranks:--model gpt --dp 16 --hidden 6 --heads 2 --ffn 10 --vocab 10 --seq 3 --layers 1"
  "gpt-step-tensor:--model gpt --tp 2 --dp 2 --step-tensor"
  "gpt-elastic-tp2-dp3:--model gpt --tp 2 --dp 3 --elastic"
  "llama-tp2-dp2:--model llama --tp 2 --dp 2 --heads 4 --kv-heads 2"
  "llama-tp4-pp2-dp3-bf16opt:--model llama --tp 4 --pp 2 --dp 3 --heads 8 --kv-heads 4 --hidden 64 --ffn 96 --bf16-optimizer"
  "llama-tp2-mqa:--model llama --tp 2 --dp 2 --heads 4 --kv-heads 2 --hidden 48 --ffn 40"
  "mixtral-tp2-dp3:--model mixtral --tp 2 --dp 3 --heads 4 --kv-heads 2"
  "mixtral-tp2-pp2-dp2-fp16:--model mixtral --tp 2 --pp 2 --dp 2 --heads 4 --kv-heads 2 --dtype fp16"
  "dsmoe-dp4-ep2:--model dsmoe --dp 4 --ep 2"
  "dsmoe-dp4-ep4:--model dsmoe --dp 4 --ep 4"
  "dsmoe-dp8-ep2-dbe:--model dsmoe --dp 8 --ep 2 --data-before-expert --experts 8"
  "dsmoe-dp6-ep3-zero2-fp16:--model dsmoe --dp 6 --ep 3 --experts 6 --zero 2 --dtype fp16"
  "gpt-zero3-dp3-subgroups-fp16:--model gpt --zero 3 --dp 3 --sub-group-size 3000 --dtype fp16"
  "gpt-zero3-dp40-empty-slices:--model gpt --zero 3 --dp 40 --sub-group-size 2000"
  "llama-zero3-dp4-bf16:--model llama --zero 3 --dp 4 --heads 4 --kv-heads 2"
  "gpt-zero3-tp2-dp3-empty-slices:--model gpt --zero 3 --tp 2 --dp 3 --hidden 4 --heads 2 --ffn 8 --vocab 10 --seq 2 --layers 2 --sub-group-size 8"
  "gpt-zero3-tp4-dp5-subgroups-fp16:--model gpt --zero 3 --tp 4 --dp 5 --sub-group-size 500 --dtype fp16"
  "gpt-untied-swiglu-zero3-tp2-dp4:--model gpt --untied --swiglu --zero 3 --tp 2 --dp 4 --sub-group-size 3000"
  "gpt-zero3-tp8-dp16-fp32:--model gpt --zero 3 --tp 8 --dp 16 --hidden 64 --ffn 128 --heads 8 --sub-group-size 1000 --dtype fp32"
  "llama-zero3-tp4-dp3-gqa:--model llama --zero 3 --tp 4 --dp 3 --heads 8 --kv-heads 4 --hidden 64 --ffn 96 --sub-group-size 2000"
  "mixtral-zero3-tp2-dp2-step-tensor:--model mixtral --zero 3 --tp 2 --dp 2 --heads 4 --kv-heads 2 --step-tensor"
  "gpt-nouc-patterns:--model gpt --tp 2 --dp 2 --no-uc-info"
  "gpt-zero3-tp2-nouc-patterns:--model gpt --zero 3 --tp 2 --dp 2 --no-uc-info"
)
for c in "${cases[@]}"; do
  name=${c%%:*}; args=${c#*:}
  dir=$work/$name
  rm -rf "$dir"; mkdir -p "$dir"
  extra=()
  if [[ $args == *--no-uc-info* ]]; then
    extra=(--patterns "$dir/patterns.json")
    $py "$root/tests/generator/gen_ds_checkpoint.py" --output "$dir/ckpt" $args --patterns-out "$dir/patterns.json" 2>/dev/null
  else
    $py "$root/tests/generator/gen_ds_checkpoint.py" --output "$dir/ckpt" $args 2>/dev/null
  fi
  ok=1
  "$bin/ucp-union" -q --input "$dir/ckpt" --output "$dir/universal" "${extra[@]}" || ok=0
  [ $ok = 1 ] && { $py "$root/tests/to_universal/check_universal.py" "$dir/universal" "$dir/ckpt" >"$dir/check.txt" || ok=0; }
  # Two-step mode on every third case; every other one of those extracts under `mpirun -np 2`.
  if [ $ok = 1 ] && [ $(( (pass + fail) % 3 )) = 0 ]; then
    mkdir -p "$dir/two"
    launch=()
    if [ $(( (pass + fail) % 6 )) = 3 ] && command -v mpirun >/dev/null; then
      launch=(mpirun --allow-run-as-root --oversubscribe -np 2)
    fi
    "${launch[@]}" "$bin/ucp-extract" -q --input "$dir/ckpt" --output "$dir/work" "${extra[@]}" &&
      "$bin/ucp-union" -q --input "$dir/work" --output "$dir/two/universal" &&
      $py "$root/tests/to_universal/check_universal.py" "$dir/two/universal" "$dir/ckpt" >>"$dir/check.txt" || ok=0
  fi
  if [ $ok = 1 ]; then pass=$((pass+1)); echo "PASS $name"; else fail=$((fail+1)); failed+=("$name"); echo "FAIL $name"; cat "$dir/check.txt" 2>/dev/null | head -5; fi
done
echo "test_ucp_matrix: $pass passed, $fail failed ${failed[*]:-}"
[ $fail = 0 ]
