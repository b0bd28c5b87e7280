"""The files of one model-parallel rank written by DeepSpeedWriter (tests/reshard/deepspeed_writer_test.cpp)
compared, through Python torch.load, with the ones dsgen writes for the same layout from the same
ground truth: compare_target.py's checks (vocabulary padding rows and averaged parameters treated as
there), restricted to mp_rank_<mp>_model_states.pt and the ZeRO-1/2 optimizer shards of that rank.

Usage: /usr/bin/python3 check_rank_files.py <ours_dir> <ref_checkpoint> <source_truth_dir> <mp>
(<ours_dir> holds the files themselves; <ref_checkpoint> is the dsgen folder with `latest`.)"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_target as ct  # noqa: E402


def main():
    ours, ref, truth_dir, mp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rd = os.path.join(ref, open(os.path.join(ref, "latest")).read().strip())
    with open(os.path.join(ref, "truth", "meta.json")) as f:
        ref_meta = json.load(f)
    lay = ref_meta["layout"]
    if lay["zero"] == 3 or lay["pp"] != 1:
        print("check_rank_files: only ZeRO-1/2 targets without pipeline")
        return 2
    tp = lay["tp"]
    model = ct.Model(truth_dir, tp)
    model.padded_rows_per_rank = ref_meta["padded_vocab"] // tp
    prefix = "bf16_" if lay["dtype"] == "bf16" else ""
    fn = f"mp_rank_{mp:02d}_model_states.pt"
    ct.compare_model_file(model, os.path.join(ours, fn), os.path.join(rd, fn), fn, mp % tp, ref_meta["pipe"])
    ct.compare_optim_files(model, ours, rd, mp, lay["dp"], mp % tp, prefix)
    if ct.ERRORS:
        print("\n".join(ct.ERRORS))
        return 1
    print(f"check_rank_files: mp {mp} model file and {lay['dp']} optimizer shards equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
