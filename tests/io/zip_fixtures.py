#!/usr/bin/env python3
"""Zip files for tests/io/zip_directory_test.cpp, with the truth from Python's own zipfile module.

Run by tests/io/fixtures.py (main(<fixtures>/zip)), or alone: zip_fixtures.py OUT_DIR

Writes into OUT_DIR:
  torch.pt        torch.save({'a': tensor, 'b': tensor, 'n': 3}) (the zip layout torch writes:
                  stored records, 64-byte aligned data, data descriptors; caffe2/serialize/inline_container.cc)
  many.zip        70,000 stored entries: more than 65,535, so zipfile writes the ZIP64 end of central
                  directory record and its locator (Lib/zipfile.py _write_end_record)
  zip64_local.zip stored entries written with force_zip64=True (ZIP64 extra field in the local headers)
  zip64_central.zip  plain.zip (3 stored entries) with its first central entry's sizes and local header
                  offset moved into a ZIP64 extra field, as for a record past 4 GiB (central_zip64)
  zip64_central_short.zip  the same with the field's offset missing (zipfile refuses it too)
  deflated.zip    one deflated record among stored ones
  duplicate.zip   the same name twice (zipfile warns "Duplicate name" and writes both)
  truth.json      per file: the record count, and name -> {data_offset, size, crc32, local_header} for
                  every record (many.zip: every 997th and the last), where data_offset is where
                  zipfile's own reader stands after it read the local header
"""
import json
import os
import struct
import sys
import warnings
import zipfile

import torch


def truth_of(path, every=1):
    """{"count": records, "records": {name: ...}} for every `every`-th record, the last one included."""
    out = {}
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        for i, info in enumerate(infos):
            if i % every and i != len(infos) - 1:
                continue
            with z.open(info) as f:
                data_offset = f._fileobj.tell()  # zipfile has read the local header and the name, extra
            out[info.filename] = {"data_offset": data_offset, "size": info.file_size, "crc32": info.CRC,
                                  "local_header": info.header_offset}
    return {"count": len(infos), "records": out}


def central_zip64(src, short=False):
    """`src` (a stored zip without ZIP64 records) with its first central entry rewritten as a writer
    must for sizes and offsets past 4 GiB (APPNOTE.TXT 4.4.8, 4.4.9, 4.4.16, 4.5.3): the uncompressed
    and compressed sizes and the local header offset set to 0xFFFFFFFF, their real values in a ZIP64
    extended information extra field (header id 0x0001) in that order. `short`: the field lacks the
    offset. The end of central directory record gets the new directory size."""
    eocd = src.rindex(b"PK\x05\x06")
    n, cd_size, cd_off = struct.unpack("<HII", src[eocd + 10:eocd + 20])
    entries, p = [], cd_off
    for i in range(n):
        fixed = bytearray(src[p:p + 46])
        nlen, xlen, clen = struct.unpack("<HHH", fixed[28:34])
        name = src[p + 46:p + 46 + nlen]
        extra = src[p + 46 + nlen:p + 46 + nlen + xlen]
        comment = src[p + 46 + nlen + xlen:p + 46 + nlen + xlen + clen]
        if i == 0:
            csize, usize = struct.unpack("<II", fixed[20:28])
            (lho,) = struct.unpack("<I", fixed[42:46])
            fixed[20:28] = struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF)
            fixed[42:46] = struct.pack("<I", 0xFFFFFFFF)
            z = struct.pack("<QQQ", usize, csize, lho)[:16 if short else 24]
            extra = struct.pack("<HH", 0x0001, len(z)) + z + extra
            fixed[30:32] = struct.pack("<H", len(extra))
        entries.append(bytes(fixed) + name + extra + comment)
        p += 46 + nlen + xlen + clen
    cd = b"".join(entries)
    end = bytearray(src[eocd:])
    end[12:16] = struct.pack("<I", len(cd))
    return src[:cd_off] + cd + bytes(end)


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.save({"a": torch.randn(5, 7), "b": torch.arange(100, dtype=torch.int64), "n": 3}, f"{out}/torch.pt")
    with zipfile.ZipFile(f"{out}/many.zip", "w", zipfile.ZIP_STORED) as z:
        for i in range(70000):
            z.writestr(f"e/{i}", str(i))
    with zipfile.ZipFile(f"{out}/zip64_local.zip", "w", zipfile.ZIP_STORED) as z:
        for i in range(3):
            with z.open(f"r{i}", "w", force_zip64=True) as f:
                f.write(bytes(range(i, i + 50)))
    with zipfile.ZipFile(f"{out}/deflated.zip", "w") as z:
        z.writestr("plain", b"stored bytes", compress_type=zipfile.ZIP_STORED)
        z.writestr("packed", b"x" * 1000, compress_type=zipfile.ZIP_DEFLATED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(f"{out}/duplicate.zip", "w", zipfile.ZIP_STORED) as z:
            z.writestr("same", b"first")
            z.writestr("same", b"second")
    with zipfile.ZipFile(f"{out}/plain.zip", "w", zipfile.ZIP_STORED) as z:
        for i in range(3):
            z.writestr(f"p{i}", bytes(range(10 * i, 10 * i + 40)))
    plain = open(f"{out}/plain.zip", "rb").read()
    open(f"{out}/zip64_central.zip", "wb").write(central_zip64(plain))
    open(f"{out}/zip64_central_short.zip", "wb").write(central_zip64(plain, short=True))
    try:  # Python's reader refuses the short field too
        zipfile.ZipFile(f"{out}/zip64_central_short.zip").infolist()
        raise AssertionError("zipfile read a ZIP64 field without the local header offset")
    except zipfile.BadZipFile:
        pass
    truth = {n: truth_of(f"{out}/{n}") for n in ("torch.pt", "zip64_local.zip", "zip64_central.zip")}
    assert truth["zip64_central.zip"] == truth_of(f"{out}/plain.zip")  # same records, other encoding
    truth["many.zip"] = truth_of(f"{out}/many.zip", every=997)
    with zipfile.ZipFile(f"{out}/many.zip") as z:  # the ZIP64 end record is really there
        assert len(z.infolist()) > 0xFFFF
    with open(f"{out}/many.zip", "rb") as f:
        assert b"PK\x06\x06" in f.read()[-200:], "no ZIP64 end of central directory record"
    with open(f"{out}/truth.json", "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
