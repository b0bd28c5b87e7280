#!/usr/bin/env bash
# The two grep-able rules of docs/architecture.md ("Rooms and the dependency rule", issue 29):
#  1. Outside lib/formats/ and lib/io/, no library or driver file spells a DeepSpeed pickle key, a
#     DeepSpeed file-name pattern or the flat-buffer padding rule: those facts have one home each
#     (lib/formats/deepspeed/, lib/formats/universal/). A string that is also one of ucpkit's own JSON
#     keys is listed in allowed.txt beside this script with the reason.
#  2. The tool modules (to_universal, reshard, pec, placement) never include each other, except
#     reshard -> to_universal/direct.h (direct mode reaches the extract planner through that one
#     header). Rooms below them (core, parallel, io, patterns, formats) include no tool module.
# Usage: tests/rooms/check_rooms.sh [SOURCE_DIR]   (exit 0: both rules hold; 1: each violation listed)
set -uo pipefail
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
here=$src/tests/rooms
cd "$src" || exit 2
bad=0

# Rule 1: DeepSpeed schema strings (pickle keys as DeepSpeed's engine writes them, file-name parts).
keys='single_partition_of_fp32_groups|param_slice_mappings|group_paddings|base_optimizer_state|fp32_flat_groups'
keys+='|ds_zero_partition_groups|optimizer_state_dict|partition_count|loss_scaler|dynamic_loss_scale'
keys+='|param_shapes|frozen_param_shapes|shared_params|buffer_names|dp_world_size|mp_world_size|global_steps'
keys+='|skipped_steps|ds_config|ds_version|clip_grad|latest|latest_universal|cat_dim|param_n_sub_params'
keys+='|sub_param_shape|vocab_tensor|is_expert_param|mp_rank_|zero_pp_rank_|_optim_states\.pt'
keys+='|_model_states\.pt|expp_rank_|global_step|ep_size_'
hits=$(grep -rnoE "\"($keys)\"" lib apps --include='*.h' --include='*.cpp' |
       grep -vE '^lib/(formats|io)/' | awk -F: '{print $1 ": " $3}' | sort -u)
while IFS= read -r hit; do
  [ -n "$hit" ] || continue
  if ! grep -qxF "$hit" <(sed -e 's/[[:space:]]*#.*$//' "$here/allowed.txt" | grep -v '^$'); then
    echo "rule 1: $hit (a DeepSpeed schema string outside lib/formats and lib/io)"
    bad=1
  fi
done <<< "$hits"
# The ZeRO-1/2 flat-buffer padding (a multiple of 2 * dp) is spelled only in formats/deepspeed/zero_partition.
pad=$(grep -rnE '2 \* (dp|world|partition|ranks|count)\b' lib --include='*.cpp' --include='*.h' |
      grep -vE '^lib/formats/deepspeed/zero_partition\.' | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true)
[ -z "$pad" ] || { echo "rule 1 (padding): $pad"; bad=1; }

# Rule 2: includes between rooms.
modules='to_universal|reshard|pec|placement'
for m in to_universal reshard pec placement core parallel io patterns formats; do
  [ -d "lib/$m" ] || continue
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<< "$line")
    [ "$target" = "$m" ] && continue
    [ "$m" = reshard ] && grep -q '#include "to_universal/direct.h"' <<< "$line" && continue
    echo "rule 2: $line (lib/$m may not include lib/$target)"
    bad=1
  done < <(grep -rnE "#include \"($modules|inspect|tool|gpu)/" "lib/$m" || true)
done
[ $bad -eq 0 ] && echo "rooms: both rules hold"
exit $bad
