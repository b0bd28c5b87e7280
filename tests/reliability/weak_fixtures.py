"""Fixtures of the WEAK cases of issue 16 (weak_test.cpp): variants of the reliability `gpt` checkpoint.
* ctrlbytes: the model file's pickle names its storages 'st\\n\\x1b[1m' instead of 'storage' (same
  length, CRC-32 rewritten): torch.load refuses it (torch/serialization.py persistent_load asserts
  typename == 'storage'); the message must not print the newline and the terminal escape raw.
* fragobj: one param_slice_mappings entry of DP rank 0 is an argparse.Namespace instead of a
  deepspeed.utils.tensor_fragment.fragment_address (a valid torch file; ucpkit must name the file)."""
import argparse
import os
import zipfile

import torch

import bugs_fixtures as bf


def make(out):
    gpt = os.path.join(out, "gpt")
    d = bf._copy(gpt, os.path.join(out, "ctrlbytes"))
    p = os.path.join(d, bf.STEP, bf.MODEL)
    rec = [n for n in zipfile.ZipFile(p).namelist() if n.endswith("/data.pkl")][0]
    old = b"X\x07\x00\x00\x00storage"

    def edit(b):
        assert old in b
        return b.replace(old, b"X\x07\x00\x00\x00st\n\x1b[1m")

    bf.patch_record(p, rec, edit)
    accepted = True
    try:
        bf._load(p)
    except Exception:  # torch refuses it
        accepted = False
    assert not accepted, "torch.load accepted the renamed storage tag"

    d = bf._copy(gpt, os.path.join(out, "fragobj"))
    p = os.path.join(d, bf.STEP, bf.OPT0)
    sd = bf._load(p)
    m = sd["optimizer_state_dict"]["param_slice_mappings"][0]
    first = next(iter(m))
    m[first] = argparse.Namespace(size=1)
    torch.save(sd, p)
    assert isinstance(bf._load(p)["optimizer_state_dict"]["param_slice_mappings"][0][first], argparse.Namespace)
