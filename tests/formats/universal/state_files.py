#!/usr/bin/python3
"""Writes universal state files (zero/<param>/<state>.pt) with torch.save, in the forms and key orders
DeepSpeed writes them (deepspeed/checkpoint/ds_to_universal.py at edaa72212: merge_tp_slices :339-458,
_save_zero3_autoep_universal_tensor :705-717; the ZeRO-3 TP = 1 form is the bare tensor), for
tests/formats/universal/state_file_test.cpp, and compares two of them with torch.load (same keys in the
same order, tensors bit for bit with dtype and shape, SubparamShape fields). Nothing here knows about ucpkit.

Usage: state_files.py <dir>            write the files
       state_files.py --same A B [A B ...]   exit 0 when each A and B load as the same value"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "io"))
from truth import SubparamShape  # noqa: E402  (registered as deepspeed.checkpoint.universal_checkpoint)
import torch  # noqa: E402


def arange(*shape):
    n = 1
    for d in shape:
        n *= d
    return torch.arange(n, dtype=torch.float32).reshape(*shape)


def main(out):
    os.makedirs(out, exist_ok=True)
    files = {
        # the default join along the row-parallel dim (:445-447)
        "cat_dim1.pt": {"cat_dim": 1, "param": arange(4, 6)},
        # parameter_with_2_sub_params_cat_dim_0 (:348-355)
        "two_sub_params.pt": {"cat_dim": 0, "param_n_sub_params": 2, "param": arange(8, 3)},
        # parameter_with_sub_params, sizes as a tuple (:441)
        "sub_params_tuple.pt": {"sub_param_shape": SubparamShape(patterns=[r".*query_key_value\.weight$"],
                                                                   shape=((8, 4, 4), -1), partition_dim=0),
                                "param": arange(16, 2)},
        # a count of equal sub-params (universal_checkpoint_version < 0.4)
        "sub_params_count.pt": {"sub_param_shape": SubparamShape(patterns=["a", "b"], shape=(3, -1),
                                                                   partition_dim=0),
                                "param": arange(6, 2)},
        # vocabulary rows cut to original_vocab_size (:449-454)
        "vocab.pt": {"cat_dim": 0, "vocab_tensor": True, "param": arange(5, 2)},
        # TP-replicated or averaged: no join key (:340-346)
        "replicated.pt": {"param": arange(3)},
        # AutoEP expert weights (:705-717)
        "expert.pt": {"param": arange(4, 2, 3), "cat_dim": 0, "is_expert_param": True, "ep_num_experts": 4},
        # ZeRO-3, TP = 1
        "bare.pt": arange(7),
    }
    for name, value in files.items():
        torch.save(value, os.path.join(out, name))
    # Damaged ones: a key holding the wrong kind of value, no tensor under 'param', not a dict.
    torch.save({"cat_dim": "1", "param": arange(2)}, os.path.join(out, "bad_cat_dim.pt"))
    torch.save({"cat_dim": 0, "param": [1.0, 2.0]}, os.path.join(out, "bad_param.pt"))
    torch.save([arange(2)], os.path.join(out, "bad_root.pt"))
    torch.save({"param": arange(2), "is_expert_param": True}, os.path.join(out, "bad_expert.pt"))
    return 0


def same(a, b):
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and \
            a.stride() == b.stride() and torch.equal(a, b)
    if isinstance(a, SubparamShape) or isinstance(b, SubparamShape):
        return type(a) is type(b) and a.patterns == b.patterns and a.shape == b.shape and \
            a.partition_dim == b.partition_dim
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def compare(a_path, b_path):
    a, b = torch.load(a_path, weights_only=False), torch.load(b_path, weights_only=False)
    if same(a, b):
        return 0
    print(f"{a_path}: {a!r}\n{b_path}: {b!r}")
    return 1


if __name__ == "__main__":
    if sys.argv[1] == "--same":
        pairs = sys.argv[2:]
        sys.exit(max(compare(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)))
    sys.exit(main(sys.argv[1]))
