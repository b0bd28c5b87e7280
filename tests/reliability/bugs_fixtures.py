"""Fixtures of tests/reliability/bugs_test.cpp (issue 16 items 6, 7, 12), made from the `gpt` checkpoint
of fixtures.py with torch 1.13 and byte patches whose effect torch itself confirms:

* expanded/, dense/: the same checkpoint with rank 0's group-0 `exp_avg_sq` replaced by 0.125 everywhere,
  stored as an expanded (stride-0, one-element storage) tensor in expanded/ and as a plain one in
  dense/ (torch.save keeps an expanded view's storage of one element: torch/_tensor.py
  _reduce_ex_internal saves the storage, offset, size and stride). The partitions keep their order,
  the fp32 groups are pickled first so the one-element storage is the file's last big record.
* crcflip/: one bit of rank 0's `exp_avg` record flipped, the zip CRC-32 left as torch.save wrote it
  (torch.load does not check it here and reads the changed value: asserted).
* badutf8/, surrogate/: a string of the model file's pickle ("MT19937", numpy's rng state) made
  invalid UTF-8 (0xff), which torch.load refuses (UnicodeDecodeError, asserted), and made an encoded
  surrogate (ED A0 80), which CPython's BINUNICODE decoding ('surrogatepass', Modules/_pickle.c
  load_binunicode) accepts (asserted); record CRCs fixed so only the string is wrong.
* rgrad_list/: the first tensor's requires_grad (NEWFALSE) in the model file's pickle made an empty
  list (EMPTY_LIST, a mutation-campaign find), which torch.load refuses ("requires_grad must be a
  bool", asserted); CRC fixed.
* renamed_root/, renamed_name/: the model file's class path `__builtin__ set` (a protocol-2 pickle of
  Python 3 spells builtins `__builtin__`, Lib/_compat_pickle.py REVERSE_IMPORT_MAPPING) made
  `_Wbuiltin__ set` (the mutation campaign's last failure, seed 2027 run 0) and `collections
  OrderedDict` made `collections OrderedDicu`; torch.load refuses both (ModuleNotFoundError,
  AttributeError: asserted); CRCs fixed."""
import collections
import os
import shutil
import struct
import zipfile
import zlib

import torch

STEP = "global_step10"
OPT0 = "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
MODEL = "mp_rank_00_model_states.pt"


def _load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def _copy(src, dst):
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def _record_span(raw, info):
    """(start, end) of a stored record's bytes in the zip file."""
    off = info.header_offset
    assert raw[off:off + 4] == b"PK\x03\x04"
    n, m = struct.unpack("<HH", raw[off + 26:off + 30])
    start = off + 30 + n + m
    return start, start + info.compress_size


def patch_record(path, name, edit, fix_crc=True):
    """Applies edit(bytes) -> bytes (same length) to one record; with fix_crc, rewrites its CRC-32 in
    the local header (when set there), the data descriptor (when there is one) and the central directory."""
    raw = bytearray(open(path, "rb").read())
    zf = zipfile.ZipFile(path)
    info = zf.getinfo(name)
    assert info.compress_type == zipfile.ZIP_STORED
    start, end = _record_span(raw, info)
    new = edit(bytes(raw[start:end]))
    assert len(new) == end - start
    raw[start:end] = new
    if fix_crc:
        crc = struct.pack("<I", zlib.crc32(new) & 0xFFFFFFFF)
        old = struct.pack("<I", info.CRC)
        off = info.header_offset
        if raw[off + 14:off + 18] == old:
            raw[off + 14:off + 18] = crc
        if info.flag_bits & 0x8:  # data descriptor after the data, optional signature
            d = end + 4 if raw[end:end + 4] == b"PK\x07\x08" else end
            assert raw[d:d + 4] == old
            raw[d:d + 4] = crc
        cd = raw.find(b"PK\x01\x02")
        while cd >= 0:
            n = struct.unpack("<H", raw[cd + 28:cd + 30])[0]
            if raw[cd + 46:cd + 46 + n] == name.encode():
                assert raw[cd + 16:cd + 20] == old
                raw[cd + 16:cd + 20] = crc
                break
            cd = raw.find(b"PK\x01\x02", cd + 46)
        else:
            raise AssertionError("no central directory entry for " + name)
    open(path, "wb").write(bytes(raw))


def _storage_record(path, tensor_key_path):
    """Zip record name of the storage behind a tensor reached by tensor_key_path in the loaded file."""
    zf = zipfile.ZipFile(path)
    pkl = [n for n in zf.namelist() if n.endswith("/data.pkl")][0]
    prefix = pkl[:-len("data.pkl")]
    obj = _load(path)
    for k in tensor_key_path:
        obj = obj[k]
    # Match by bytes: the record whose content equals the storage's bytes.
    want = obj.storage().cpu()
    data = bytes(want._untyped() if hasattr(want, "_untyped") else want.untyped())
    for n in zf.namelist():
        if n.startswith(prefix + "data/") and zf.read(n) == data:
            return n
    raise AssertionError("storage record not found")


def make(out):
    gpt = os.path.join(out, "gpt")
    # 6: expanded (stride-0) exp_avg_sq partition and its dense twin.
    for name, expand in (("expanded", True), ("dense", False)):
        d = _copy(gpt, os.path.join(out, name))
        p = os.path.join(d, STEP, OPT0)
        sd = _load(p)
        osd = sd["optimizer_state_dict"]
        st = osd["base_optimizer_state"]["state"][0]
        n = st["exp_avg_sq"].numel()
        st["exp_avg_sq"] = torch.full((1,), 0.125).expand(n) if expand else torch.full((n,), 0.125)
        assert (st["exp_avg_sq"].stride() == (0,)) == expand
        # fp32 partitions pickled before the optimizer state: the exp_avg_sq storage comes late.
        keys = ["single_partition_of_fp32_groups"] + [k for k in osd if k != "single_partition_of_fp32_groups"]
        sd["optimizer_state_dict"] = collections.OrderedDict((k, osd[k]) for k in keys)
        torch.save(sd, p)
        back = _load(p)["optimizer_state_dict"]["base_optimizer_state"]["state"][0]["exp_avg_sq"]
        assert back.stride() == ((0,) if expand else (1,)) and bool((back == 0.125).all())

    # 12: one flipped bit in rank 0's group-0 exp_avg record, CRC left stale.
    d = _copy(gpt, os.path.join(out, "crcflip"))
    p = os.path.join(d, STEP, OPT0)
    key = ["optimizer_state_dict", "base_optimizer_state", "state", 0, "exp_avg"]
    rec = _storage_record(p, key)
    before = _load(p)
    for k in key:
        before = before[k]
    before = before.clone()
    patch_record(p, rec, lambda b: b[:1001] + bytes([b[1001] ^ 0x40]) + b[1002:], fix_crc=False)
    after = _load(p)
    for k in key:
        after = after[k]
    assert not torch.equal(before, after), "the flipped bit must change a value torch reads"

    # 7: invalid UTF-8 (refused by torch.load) and an encoded surrogate (accepted) in a pickle string.
    for name, repl in (("badutf8", b"MT1993\xff"), ("surrogate", b"MT\xed\xa0\x8037")):
        d = _copy(gpt, os.path.join(out, name))
        p = os.path.join(d, STEP, MODEL)
        pkl = [n for n in zipfile.ZipFile(p).namelist() if n.endswith("/data.pkl")][0]

        def edit(b, repl=repl):
            assert b.count(b"MT19937") == 1
            return b.replace(b"MT19937", repl)

        patch_record(p, pkl, edit)
        try:
            _load(p)
            loaded = True
        except UnicodeDecodeError:
            loaded = False
        assert loaded == (name == "surrogate"), name

    d = _copy(gpt, os.path.join(out, "rgrad_list"))
    p = os.path.join(d, STEP, MODEL)
    pkl = [n for n in zipfile.ZipFile(p).namelist() if n.endswith("/data.pkl")][0]

    def to_list(b):
        at = b.index(b"\x89", b.index(b"_rebuild_tensor_v2"))  # first NEWFALSE after it: requires_grad
        return b[:at] + b"]" + b[at + 1:]

    patch_record(p, pkl, to_list)
    try:
        _load(p)
        raise AssertionError("torch.load took a list as requires_grad")
    except RuntimeError as e:
        assert "requires_grad" in str(e), e

    for name, old, new, refused in (("renamed_root", b"c__builtin__\nset\n", b"c_Wbuiltin__\nset\n", ModuleNotFoundError),
                                    ("renamed_name", b"ccollections\nOrderedDict\n", b"ccollections\nOrderedDicu\n",
                                     AttributeError)):
        d = _copy(gpt, os.path.join(out, name))
        p = os.path.join(d, STEP, MODEL)
        pkl = [n for n in zipfile.ZipFile(p).namelist() if n.endswith("/data.pkl")][0]

        def rename(b, old=old, new=new):
            assert b.count(old) == 1, (old, b.count(old))
            return b.replace(old, new)

        patch_record(p, pkl, rename)
        try:
            _load(p)
            raise AssertionError("torch.load read %s" % name)
        except refused:
            pass
