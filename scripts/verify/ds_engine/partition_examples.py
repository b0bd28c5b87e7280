#!/usr/bin/python3
"""Worked examples of DeepSpeed's PipelineModule partition methods, computed by DeepSpeed's own code:
partition_uniform and partition_balanced are taken verbatim from deepspeed/runtime/utils.py of a
DeepSpeed git checkout (git show <rev>:deepspeed/runtime/utils.py; the two functions' text only, run
with numpy: the module itself needs torch and a device), and _partition_layers' choice of weights
(deepspeed/runtime/pipe/module.py: 'uniform' -> partition_uniform(len(layers)), 'parameters' ->
partition_balanced(per-layer parameter counts), 'type:<regex>' -> partition_balanced(0/1 per layer whose
class name matches, case-insensitive search)) is spelled here from that file's text (v0.14.5 :387-412,
v0.19.6 :396-421). tests/formats/deepspeed/partition_test.cpp holds the printed results.
Usage: partition_examples.py DEEPSPEED_GIT_DIR [REV ...]   (default revs: v0.14.5 HEAD)"""
import ast
import json
import re
import subprocess
import sys


def functions(git_dir, rev):
    src = subprocess.run(["git", "-C", git_dir, "show", f"{rev}:deepspeed/runtime/utils.py"], check=True,
                         capture_output=True, text=True).stdout
    tree = ast.parse(src)
    ns = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("partition_uniform", "partition_balanced"):
            exec(compile(ast.Module(body=[node], type_ignores=[]), f"{rev}:utils.py", "exec"), ns)
    return ns["partition_uniform"], ns["partition_balanced"]


CASES = {
    "uniform": [(10, 4), (3, 4), (4, 4), (7, 2), (13, 3), (1, 1), (0, 2)],
    "balanced": [([1] * 10, 4), ([5, 1, 1, 1, 1, 5], 2), ([3, 4, 5], 4), ([0, 10, 10, 10, 10, 0], 2),
                 ([0, 100, 5, 5, 5, 5, 5, 5, 100, 0], 3), ([7, 7, 7, 7, 7, 7, 7], 3), ([1, 2, 3, 4, 5, 6, 7, 8], 4),
                 ([0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0], 2), ([10, 0, 0, 0, 10], 2), ([640, 1000, 1000, 1000, 1000, 20, 640], 2)],
}


def main():
    git_dir = sys.argv[1]
    revs = sys.argv[2:] or ["v0.14.5", "HEAD"]
    out = {}
    for rev in revs:
        uniform, balanced = functions(git_dir, rev)
        r = {"uniform": [[n, p, [int(x) for x in uniform(n, p)]] for n, p in CASES["uniform"]],
             "balanced": [[w, p, [int(x) for x in balanced(w, p)]] for w, p in CASES["balanced"]]}
        # type:<regex>: 0/1 weights from a case-insensitive search over the layer class names.
        names = ["EmbeddingPipe", "TransformerBlock", "TransformerBlock", "TransformerBlock", "TransformerBlock",
                 "LayerNorm", "EmbeddingPipe"]
        w = [1 if re.search("transformer", n, re.IGNORECASE) else 0 for n in names]
        r["type:transformer"] = [names, 2, [int(x) for x in balanced(w, 2)]]
        out[rev] = r
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
