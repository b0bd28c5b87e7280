"""The judge of two resumes of scripts/frameworks/dcp_train_loop.py (issue 47): the records `resume`
wrote for the loop resumed from the original checkpoint (torch's own reshard-on-load) and from ucpkit's
output. For every variant: the same values loaded (gathered whole, as digests), the same next steps
(losses, learning rates, data positions, step counters, bit for bit), the train_state's bytes loaded
(the losses before), and the non-tensor items loaded (positions and steps continue from the save's).

    python3 dcp_resume_compare.py ORIG.json OURS.json [--saved-steps 3]
"""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("orig")
    p.add_argument("ours")
    p.add_argument("--saved-steps", type=int, default=3, help="the steps the save trained (the resumed ones follow)")
    args = p.parse_args()
    orig, ours = (json.load(open(f)) for f in (args.orig, args.ours))
    assert orig.keys() == ours.keys(), (orig.keys(), ours.keys())
    n = args.saved_steps
    for v in orig:
        a, b = orig[v], ours[v]
        diff = [k for k in a["loaded"] if a["loaded"][k] != b["loaded"].get(k)] + sorted(set(b["loaded"]) - set(a["loaded"]))
        assert not diff, f"{v}: loaded values differ: {diff[:5]}"
        assert a["steps"] == b["steps"], f"{v}: the resumed steps differ:\n{a['steps']}\n{b['steps']}"
        assert a["losses_before"] == b["losses_before"] and len(b["losses_before"]) == n, f"{v}: train_state bytes"
        follow = list(range(n + 1, n + 1 + len(b["steps"])))
        assert [s["position"] for s in b["steps"]] == follow and [s["step"] for s in b["steps"]] == follow, v
        print(f"{v}: {len(a['loaded'])} values loaded equal; next losses {[s['loss'] for s in b['steps']]}, "
              f"lrs {[s['lr'] for s in b['steps']]} equal")
    print(f"values loaded: {sum(len(v['loaded']) for v in orig.values())}")


if __name__ == "__main__":
    sys.exit(main())
