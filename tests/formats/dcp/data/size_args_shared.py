"""Writes size_args_shared/.metadata: a DCP Metadata pickled (protocol 4, as torch's FileSystemWriter.finish does)
with one tuple object as the arguments of both of its torch.Size([4]) reductions, so the pickle fetches that tuple
from its memo after the first Size is made. torch's own save never does (torch.Size's
__reduce__ makes fresh tuples); the one-pass reader folds a Size's tuples into it and must leave such a file to the
general unpickler (metadata_direct_test.cpp). Hand-made: the damage-like case, not a fixture of torch's save.
Usage: python size_args_shared.py OUT_DIR   (the pinned environment's python: torch 2.15.0)"""
import os
import pickle
import sys

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)

shared = ((4,),)


class SharedSizeArgs(pickle.Pickler):
    def reducer_override(self, obj):
        if type(obj) is torch.Size and tuple(obj) == (4,):
            return (torch.Size, shared)
        return NotImplemented


md = Metadata(
    state_dict_metadata={"w": TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([4]),
                                                    [ChunkStorageMetadata(torch.Size([0]), torch.Size([4]))])},
    planner_data={"w": ("w",)},
    storage_data={MetadataIndex("w", torch.Size([0])): _StorageInfo("__0_0.distcp", 0, 1000)})
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], ".metadata"), "wb") as f:
    SharedSizeArgs(f, protocol=4).dump(md)
