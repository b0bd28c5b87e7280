#!/usr/bin/python3
"""Runs DeepSpeed's own deepspeed/checkpoint/ds_to_universal.py from a source tree (DS_SRC, as
train_engine.py imports it), with the same stand-ins (version.txt as the installed version; hjson).
Usage: DS_SRC=... ds_to_universal_run.py --input_folder CKPT/global_stepN --output_folder CKPT/global_stepN_universal
       [--inject_missing_state] ...   (ds_to_universal.py's own arguments; it writes CKPT/latest_universal)"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_moe_tutorial import standins  # noqa: E402

if __name__ == "__main__":
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    standins()
    from deepspeed.checkpoint import ds_to_universal  # imported, not run as __main__: its workers pickle its functions
    ds_to_universal.main(ds_to_universal.parse_arguments())
