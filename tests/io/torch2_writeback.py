"""Compares a torch file written by ucpkit with the torch >= 2.0 file it was read from.

1. data.pkl of both, decoded opcode by opcode into a symbolic call tree (no class is imported:
   every GLOBAL becomes a named symbol, REDUCE/NEWOBJ/BUILD/SETITEM(S)/APPEND(S) are recorded,
   persistent ids keep their storage class, location and size, and keys become first-use indexes):
   the trees must be equal, so every torch._tensor._rebuild_from_type_v2 and
   torch._utils._rebuild_parameter_with_state record comes back with its function, type, arguments
   and attribute state. Memo opcodes (PUT/GET) are the only thing ignored.
2. the zip records: same names in the same order as torch 2.x writes them (data.pkl,
   .format_version, .storage_alignment, byteorder, data/<k>..., version, .data/serialization_id),
   record data 64-byte aligned, same .format_version / .storage_alignment / byteorder / version.
3. torch.load of this Python's torch (Debian's 1.13) on both files: same values (truth.py's
   describe); if torch cannot load the original either (constructs newer than it), both must fail
   and that is reported.
Exit 0: equal; 1: differences (printed).  Usage: torch2_writeback.py <original.pt> <written.pt>"""
import io
import os
import pickle
import struct
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class Call:
    def __init__(self, name, how, args):
        self.name, self.how, self.args, self.state, self.items, self.sets = name, how, args, None, [], []

    def __setstate__(self, state):
        self.state = state

    def append(self, x):
        self.items.append(x)

    def extend(self, xs):
        self.items.extend(xs)

    def __setitem__(self, k, v):
        self.sets.append((k, v))


def symbol(full):
    class Meta(type):
        def __call__(cls, *args):
            return Call(full, "call", args)

    class Sym(metaclass=Meta):
        def __new__(cls, *args):
            return Call(full, "new", args)
    Sym.full = full
    return Sym


class SymbolicUnpickler(pickle.Unpickler):
    def __init__(self, data):
        super().__init__(io.BytesIO(data))
        self.keys = {}

    def find_class(self, module, name):
        if module == "__builtin__":
            module = "builtins"
        return symbol(module + "." + name)

    def persistent_load(self, pid):
        idx = self.keys.setdefault(pid[2], len(self.keys))
        return ("storage", pid[1].full, idx, pid[3], pid[4])


def canon(o):
    if isinstance(o, Call):
        if o.name == "_codecs.encode" and len(o.args) == 2:
            return ("bytes", o.args[0].encode(o.args[1]))
        if o.name == "builtins.bytes" and not o.args:
            return ("bytes", b"")
        return ("call", o.name, o.how, canon(o.args), canon(o.state), canon(o.items), canon(o.sets))
    if isinstance(o, type) and hasattr(o, "full"):
        return ("global", o.full)
    if isinstance(o, dict):
        return ("dict", tuple((canon(k), canon(v)) for k, v in o.items()))
    if isinstance(o, list):
        return ("list", tuple(canon(x) for x in o))
    if isinstance(o, tuple):
        return ("tuple", tuple(canon(x) for x in o))
    if isinstance(o, float):
        return ("float", struct.pack("<d", o))
    if isinstance(o, bytes):
        return ("bytes", o)
    return (type(o).__name__, o)


def first_diff(a, b, path="$"):
    if type(a) != type(b) or (not isinstance(a, tuple) and a != b):
        return f"{path}: {a!r:.300} != {b!r:.300}"
    if isinstance(a, tuple):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}: {a!r:.300} vs {b!r:.300}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_diff(x, y, f"{path}[{i}]")
            if d:
                return d
    return None


def records(path):
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        prefix = infos[0].filename.split("/")[0]
        names = [i.filename[len(prefix) + 1:] for i in infos]
        texts = {n: z.read(prefix + "/" + n) for n in names
                 if n in (".format_version", ".storage_alignment", "byteorder", "version")}
        pkl = z.read(prefix + "/data.pkl")
    raw = open(path, "rb").read()
    unaligned = []
    for i in infos:  # data offset = local header + 30 + name + extra
        n, e = struct.unpack("<HH", raw[i.header_offset + 26:i.header_offset + 30])
        if (i.header_offset + 30 + n + e) % 64:
            unaligned.append(i.filename)
    return names, texts, pkl, unaligned


def main():
    orig, written = sys.argv[1], sys.argv[2]
    problems = []
    n1, t1, p1, _ = records(orig)
    n2, t2, p2, u2 = records(written)
    if n1 != n2:
        problems.append(f"records {n2} != torch's {n1}")
    if t1 != t2:
        problems.append(f"record texts {t2} != torch's {t1}")
    if u2:
        problems.append(f"records not 64-byte aligned: {u2}")
    c1, c2 = canon(SymbolicUnpickler(p1).load()), canon(SymbolicUnpickler(p2).load())
    d = first_diff(c1, c2)
    if d:
        problems.append("data.pkl call trees differ: " + d)
    count = repr(c1).count("'torch._tensor._rebuild_from_type_v2'")
    count_p = repr(c1).count("'torch._utils._rebuild_parameter_with_state'")
    print(f"{count} _rebuild_from_type_v2 and {count_p} _rebuild_parameter_with_state records compared")

    import torch  # noqa: E402
    import truth  # noqa: E402,F401
    loaded = []
    for p in (orig, written):
        try:
            loaded.append(truth.describe(torch.load(p, weights_only=False) if torch.__version__ >= "2"
                                         else torch.load(p, weights_only=False)))
        except Exception as e:  # noqa: BLE001
            loaded.append(f"{type(e).__name__}: {e}")
    if isinstance(loaded[0], str) != isinstance(loaded[1], str):
        problems.append(f"torch {torch.__version__} load: original {str(loaded[0])[:200]} / written {str(loaded[1])[:200]}")
    elif isinstance(loaded[0], str):
        print(f"torch {torch.__version__} cannot load the original either ({loaded[0][:160]})")
    else:
        problems += truth.diff(loaded[0], loaded[1])
        print(f"torch {torch.__version__} loads both with the same values")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
