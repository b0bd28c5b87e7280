#!/usr/bin/env python3
"""Zip files for tests/io/zip_directory_test.cpp, with the truth from Python's own zipfile module.

Run by tests/io/fixtures.py (main(<fixtures>/zip)), or alone: zip_fixtures.py OUT_DIR

Writes into OUT_DIR:
  torch.pt        torch.save({'a': tensor, 'b': tensor, 'n': 3}) (the zip layout torch writes:
                  stored records, 64-byte aligned data, data descriptors; caffe2/serialize/inline_container.cc)
  many.zip        70,000 stored entries: more than 65,535, so zipfile writes the ZIP64 end of central
                  directory record and its locator (Lib/zipfile.py _write_end_record)
  zip64_local.zip stored entries written with force_zip64=True (ZIP64 extra field in the local headers)
  deflated.zip    one deflated record among stored ones
  duplicate.zip   the same name twice (zipfile warns "Duplicate name" and writes both)
  truth.json      per file: the record count, and name -> {data_offset, size, crc32, local_header} for
                  every record (many.zip: every 997th and the last), where data_offset is where
                  zipfile's own reader stands after it read the local header
"""
import json
import os
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
    truth = {n: truth_of(f"{out}/{n}") for n in ("torch.pt", "zip64_local.zip")}
    truth["many.zip"] = truth_of(f"{out}/many.zip", every=997)
    with zipfile.ZipFile(f"{out}/many.zip") as z:  # the ZIP64 end record is really there
        assert len(z.infolist()) > 0xFFFF
    with open(f"{out}/many.zip", "rb") as f:
        assert b"PK\x06\x06" in f.read()[-200:], "no ZIP64 end of central directory record"
    with open(f"{out}/truth.json", "w") as f:
        json.dump(truth, f)


if __name__ == "__main__":
    main(sys.argv[1])
