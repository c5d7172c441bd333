"""Append one row group to an existing parquet file without rewriting its earlier row groups.

A parquet file is ``PAR1 | row group 0 | ... | row group n | footer | len(footer) | PAR1``; the
footer (Thrift compact ``FileMetaData``) lists every row group with absolute byte offsets. To add a
row group we encode it with pyarrow into a buffer (offsets relative to that buffer), shift its
offsets to where it will sit in the file (where the old footer begins), merge it into the old
footer, then truncate the old footer away and write ``row group | new footer``. Earlier row groups
are never touched; the only bytes overwritten are the old footer's, and the caller keeps a copy of
them (``ParquetTail``) in its journal so a torn append is undone by ``restore_tail``.

pyarrow has no public way to set a row group's offsets, so ``_shift_offsets`` rewrites the few
offset fields of the Thrift structs (parquet-format's ``parquet.thrift``: RowGroup.file_offset,
ColumnChunk.file_offset / offset_index_offset / column_index_offset, ColumnMetaData's
data_page / index_page / dictionary_page / bloom_filter offsets) with a small generic Thrift
compact-protocol reader/writer.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"PAR1"

# Thrift compact protocol type ids
_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


# -- a generic Thrift compact codec: structs are lists of (field id, type, value) -------------------
class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, ttype: int) -> Any:
        if ttype in (_BOOL_TRUE, _BOOL_FALSE):  # only inside containers: one byte each
            return self.byte() == _BOOL_TRUE
        if ttype == _BYTE:
            return self.byte()
        if ttype in (_I16, _I32, _I64):
            return self.zigzag()
        if ttype == _DOUBLE:
            v = self.data[self.pos : self.pos + 8]
            self.pos += 8
            return v
        if ttype == _BINARY:
            n = self.varint()
            v = self.data[self.pos : self.pos + n]
            self.pos += n
            return v
        if ttype in (_LIST, _SET):
            head = self.byte()
            size, etype = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            return (etype, [self.value(etype) for _ in range(size)])
        if ttype == _MAP:
            size = self.varint()
            if size == 0:
                return (0, 0, [])
            kv = self.byte()
            kt, vt = kv >> 4, kv & 0x0F
            return (kt, vt, [(self.value(kt), self.value(vt)) for _ in range(size)])
        if ttype == _STRUCT:
            return self.struct()
        raise ValueError(f"unknown thrift compact type {ttype}")

    def struct(self) -> list[list[Any]]:
        fields: list[list[Any]] = []
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            ttype, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self.zigzag()
            if ttype in (_BOOL_TRUE, _BOOL_FALSE):
                val: Any = ttype == _BOOL_TRUE
            else:
                val = self.value(ttype)
            fields.append([fid, ttype, val])
            last = fid


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def varint(self, n: int) -> None:
        while True:
            if n < 0x80:
                self.out.append(n)
                return
            self.out.append((n & 0x7F) | 0x80)
            n >>= 7

    def zigzag(self, n: int) -> None:
        self.varint((n << 1) ^ (n >> 63))

    def value(self, ttype: int, v: Any) -> None:
        if ttype in (_BOOL_TRUE, _BOOL_FALSE):
            self.out.append(_BOOL_TRUE if v else _BOOL_FALSE)
        elif ttype == _BYTE:
            self.out.append(v & 0xFF)
        elif ttype in (_I16, _I32, _I64):
            self.zigzag(v)
        elif ttype == _DOUBLE:
            self.out += v
        elif ttype == _BINARY:
            self.varint(len(v))
            self.out += v
        elif ttype in (_LIST, _SET):
            etype, items = v
            if len(items) < 15:
                self.out.append((len(items) << 4) | etype)
            else:
                self.out.append(0xF0 | etype)
                self.varint(len(items))
            for item in items:
                self.value(etype, item)
        elif ttype == _MAP:
            kt, vt, items = v
            self.varint(len(items))
            if items:
                self.out.append((kt << 4) | vt)
                for k, val in items:
                    self.value(kt, k)
                    self.value(vt, val)
        elif ttype == _STRUCT:
            self.struct(v)
        else:
            raise ValueError(f"unknown thrift compact type {ttype}")

    def struct(self, fields: list[list[Any]]) -> None:
        last = 0
        for fid, ttype, val in fields:
            wire_type = (_BOOL_TRUE if val else _BOOL_FALSE) if ttype in (_BOOL_TRUE, _BOOL_FALSE) else ttype
            delta = fid - last
            if 0 < delta <= 15:
                self.out.append((delta << 4) | wire_type)
            else:
                self.out.append(wire_type)
                self.zigzag(fid)
            if ttype not in (_BOOL_TRUE, _BOOL_FALSE):
                self.value(ttype, val)
            last = fid
        self.out.append(0)


# parquet.thrift field ids holding absolute file offsets
_ROWGROUP_FILE_OFFSET = 5
_ROWGROUP_COLUMNS = 1
_CHUNK_OFFSETS = (2, 4, 6)  # file_offset, offset_index_offset, column_index_offset
_CHUNK_META = 3
_META_OFFSETS = (9, 10, 11, 14)  # data_page, index_page, dictionary_page, bloom_filter offsets
_FILEMETA_ROW_GROUPS = 4


def _shift(fields: list[list[Any]], ids: tuple[int, ...], delta: int) -> None:
    for f in fields:
        if f[0] in ids and f[1] in (_I32, _I64):
            f[2] += delta


def _shift_offsets(footer: bytes, delta: int) -> bytes:
    """The same FileMetaData with every row group moved ``delta`` bytes further into the file."""
    meta = _Reader(footer).struct()
    for f in meta:
        if f[0] != _FILEMETA_ROW_GROUPS:
            continue
        for rg in f[2][1]:
            _shift(rg, (_ROWGROUP_FILE_OFFSET,), delta)
            for g in rg:
                if g[0] != _ROWGROUP_COLUMNS:
                    continue
                for chunk in g[2][1]:
                    _shift(chunk, _CHUNK_OFFSETS, delta)
                    for c in chunk:
                        if c[0] == _CHUNK_META:
                            _shift(c[2], _META_OFFSETS, delta)
    w = _Writer()
    w.struct(meta)
    return bytes(w.out)


# -- the append -------------------------------------------------------------------------------------
@dataclass
class ParquetTail:
    """What an append overwrites: the file's length and its footer bytes (from ``data_end``)."""

    length: int
    data_end: int
    tail: bytes


def read_tail(path: Path) -> ParquetTail:
    length = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(length - 8)
        trailer = fh.read(8)
        if len(trailer) != 8 or trailer[4:] != MAGIC:
            raise ValueError(f"{path} is not a complete parquet file (no PAR1 trailer)")
        footer_len = struct.unpack("<i", trailer[:4])[0]
        data_end = length - 8 - footer_len
        fh.seek(data_end)
        tail = fh.read()
    return ParquetTail(length, data_end, tail)


def restore_tail(path: Path, saved: ParquetTail) -> None:
    """Undo a torn append: cut the file back to its old data end and put its old footer back."""
    with open(path, "r+b") as fh:
        fh.truncate(saved.data_end)
        fh.seek(saved.data_end)
        fh.write(saved.tail)
        fh.flush()
        os.fsync(fh.fileno())


def encode_row_group(table: Any) -> tuple[bytes, bytes]:
    """(row group bytes, footer bytes) of ``table`` written alone (offsets relative to PAR1 at 0)."""
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    with pq.ParquetWriter(buf, table.schema, compression="snappy", use_dictionary=True) as w:
        w.write_table(table)
    out = buf.getvalue()
    footer_len = struct.unpack("<i", out[-8:-4])[0]
    body_end = len(out) - 8 - footer_len
    return out[len(MAGIC) : body_end], out[body_end : len(out) - 8]


def write_new(path: Path, table: Any) -> None:
    """A new parquet file holding ``table`` as one row group (fsynced)."""
    import pyarrow.parquet as pq

    with open(path, "wb") as fh:
        with pq.ParquetWriter(fh, table.schema, compression="snappy", use_dictionary=True) as w:
            w.write_table(table)
        fh.flush()
        os.fsync(fh.fileno())


def append_row_group(path: Path, table: Any) -> ParquetTail:
    """Append ``table`` (same schema as the file) as a new row group, fsynced.

    Returns the tail it overwrote. The caller must have saved ``read_tail(path)`` durably (its
    journal) before calling this, and keeps it until the append is committed.
    """
    import pyarrow.parquet as pq

    saved = read_tail(path)
    body, footer = encode_row_group(table)
    shifted = _shift_offsets(footer, saved.data_end - len(MAGIC))
    new_meta = pq.read_metadata(io.BytesIO(MAGIC + shifted + struct.pack("<i", len(shifted)) + MAGIC))
    merged = pq.read_metadata(io.BytesIO(MAGIC + saved.tail))
    if not merged.schema.to_arrow_schema().equals(new_meta.schema.to_arrow_schema()):
        raise ValueError(f"{path}: the new rows' schema differs from the file's")
    merged.append_row_groups(new_meta)
    out = io.BytesIO()
    merged.write_metadata_file(out)
    new_tail = out.getvalue()[len(MAGIC) :]  # footer | len | PAR1
    with open(path, "r+b") as fh:
        fh.truncate(saved.data_end)
        fh.seek(saved.data_end)
        fh.write(body)
        fh.write(new_tail)
        fh.flush()
        os.fsync(fh.fileno())
    return saved
