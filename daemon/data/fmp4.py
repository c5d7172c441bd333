"""Packed episode videos as fragmented MP4: an episode is appended, never rewritten.

A fragmented MP4 (FFmpeg's ``movflags=frag_keyframe+empty_moov+default_base_moof``) is
``ftyp | moov (no samples) | moof | mdat | moof | mdat ...``. Each ``moof`` describes its own
samples with offsets relative to itself (``default_base_moof``) and says when its first sample is
decoded (``tfdt``). So appending an episode to a packed file is: remux the staged episode (stream
copy, no re-encoding) into a fragmented MP4 in memory, shift its ``tfdt`` times to start where the
file ends, and append its ``moof``/``mdat`` boxes. The bytes of earlier episodes are never
touched; a torn append is undone by truncating the file to its committed length.

PyAV (FFmpeg's mov demuxer) reads such a file as one stream whose timestamps run on across
episodes, which is what LeRobot's decoder expects: it seeks to an episode's ``from_timestamp``
plus the frame's timestamp (``lerobot/datasets/video_utils.py: decode_video_frames_pyav``).
An episode is appended only when its codec setup (the ``moov`` box, bit-rate hint aside) equals
the file's; otherwise the caller starts a new file.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path

FRAG_FLAGS = "frag_keyframe+empty_moov+default_base_moof"
_CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"moof", b"traf", b"mvex", b"edts", b"dinf"}


def boxes(data: bytes, start: int = 0, end: int | None = None) -> list[tuple[bytes, int, int]]:
    """Top-level boxes of ``data[start:end]`` as (type, offset, size)."""
    end = len(data) if end is None else end
    out = []
    pos = start
    while pos + 8 <= end:
        size, typ = struct.unpack(">I4s", data[pos : pos + 8])
        if size == 1:
            size = struct.unpack(">Q", data[pos + 8 : pos + 16])[0]
        elif size == 0:
            size = end - pos
        if size < 8 or pos + size > end:
            raise ValueError(f"truncated or corrupt MP4 box {typ!r} at {pos}")
        out.append((typ, pos, size))
        pos += size
    return out


def _find(data: bytes, path: list[bytes], start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Every box at ``path`` (e.g. [b"moov", b"trak", b"mdia", b"mdhd"]) as (offset, size)."""
    found = []
    for typ, pos, size in boxes(data, start, end if end is not None else len(data)):
        if typ != path[0]:
            continue
        if len(path) == 1:
            found.append((pos, size))
        elif typ in _CONTAINERS:
            found.extend(_find(data, path[1:], pos + 8, pos + size))
    return found


@dataclass
class Fragmented:
    """One episode remuxed as a fragmented MP4, ready to start or extend a packed file."""

    header: bytes  # ftyp + moov: only written when the episode starts a new file
    fragments: bytes  # moof/mdat pairs, decode times from 0
    timescale: int  # track ticks per second
    duration_ticks: int
    moov_key: bytes  # the moov with the bit-rate hint blanked: equal keys can share a file

    def shifted(self, start_ticks: int, first_sequence: int) -> bytes:
        """The fragments with decode times moved by ``start_ticks``, numbered from ``first_sequence``."""
        buf = bytearray(self.fragments)
        seq = first_sequence
        for moof, size in _find(bytes(buf), [b"moof"]):
            for mfhd, _ in _find(bytes(buf), [b"mfhd"], moof + 8, moof + size):
                struct.pack_into(">I", buf, mfhd + 12, seq)
            seq += 1
            for tfdt, _ in _find(bytes(buf), [b"traf", b"tfdt"], moof + 8, moof + size):
                version = buf[tfdt + 8]
                if version == 1:
                    (t,) = struct.unpack_from(">Q", buf, tfdt + 12)
                    struct.pack_into(">Q", buf, tfdt + 12, t + start_ticks)
                else:
                    (t,) = struct.unpack_from(">I", buf, tfdt + 12)
                    struct.pack_into(">I", buf, tfdt + 12, t + start_ticks)
        return bytes(buf)

    def fragment_count(self) -> int:
        return len(_find(self.fragments, [b"moof"]))


def _moov_key(moov: bytes) -> bytes:
    key = bytearray(moov)
    i = key.find(b"btrt")
    if i >= 0:  # bufferSizeDB, maxBitrate, avgBitrate differ per episode and mean nothing here
        key[i + 4 : i + 16] = bytes(12)
    return bytes(key)


def fragment_episode(src: Path) -> Fragmented:
    """Remux a staged episode MP4 (stream copy) into a fragmented MP4 in memory."""
    import av

    buf = io.BytesIO()
    with av.open(str(src)) as inp:
        ist = inp.streams.video[0]
        out = av.open(buf, "w", format="mp4", options={"movflags": FRAG_FLAGS})
        try:
            ost = out.add_stream_from_template(ist)
            ost.time_base = ist.time_base
            for pkt in inp.demux(ist):
                if pkt.dts is None:  # the demuxer's end-of-stream flush packet
                    continue
                pkt.stream = ost
                out.mux(pkt)
        finally:
            out.close()
    data = buf.getvalue()
    top = boxes(data)
    header = b"".join(data[p : p + s] for t, p, s in top if t in (b"ftyp", b"moov"))
    fragments = b"".join(data[p : p + s] for t, p, s in top if t in (b"moof", b"mdat"))  # no mfra
    ((moov_pos, moov_size),) = _find(data, [b"moov"])
    ((mdhd, _),) = _find(data, [b"moov", b"trak", b"mdia", b"mdhd"])
    version = data[mdhd + 8]
    timescale = struct.unpack_from(">I", data, mdhd + (28 if version == 1 else 20))[0]
    duration = 0
    for moof, size in _find(data, [b"moof"]):
        for trun, _tsize in _find(data, [b"traf", b"trun"], moof + 8, moof + size):
            duration += _trun_duration(data, trun, moof, size)
    return Fragmented(header, fragments, timescale, duration, _moov_key(data[moov_pos : moov_pos + moov_size]))


def _trun_duration(data: bytes, trun: int, moof: int, moof_size: int) -> int:
    """Sum of sample durations in a trun (falling back to the traf's default duration)."""
    flags = int.from_bytes(data[trun + 9 : trun + 12], "big")
    count = struct.unpack_from(">I", data, trun + 12)[0]
    pos = trun + 16
    if flags & 0x1:
        pos += 4
    if flags & 0x4:
        pos += 4
    per_sample = [(0x100, 4), (0x200, 4), (0x400, 4), (0x800, 4)]
    default = None
    if not flags & 0x100:
        default = _tfhd_default_duration(data, moof, moof_size)
    total = 0
    for _ in range(count):
        for bit, n in per_sample:
            if flags & bit:
                if bit == 0x100:
                    total += struct.unpack_from(">I", data, pos)[0]
                pos += n
        if default is not None:
            total += default
    return total


def _tfhd_default_duration(data: bytes, moof: int, moof_size: int) -> int:
    ((tfhd, _),) = _find(data, [b"traf", b"tfhd"], moof + 8, moof + moof_size)
    flags = int.from_bytes(data[tfhd + 9 : tfhd + 12], "big")
    pos = tfhd + 16  # after the track id
    if flags & 0x1:
        pos += 8
    if flags & 0x2:
        pos += 4
    if not flags & 0x8:
        raise ValueError("fragment without sample durations")
    return struct.unpack_from(">I", data, pos)[0]


def read_moov_key(path: Path) -> bytes | None:
    """The packed file's codec key (``None`` if it is not a fragmented MP4 we can extend)."""
    with open(path, "rb") as fh:
        head = fh.read(64 * 1024)
    try:
        top = boxes(head[: _prefix_end(head)])
    except ValueError:
        return None
    types = [t for t, _, _ in top]
    if types[:2] != [b"ftyp", b"moov"]:
        return None
    _, pos, size = top[1]
    moov = head[pos : pos + size]
    if not _find(moov, [b"moov", b"mvex"]):
        return None  # a plain MP4 (e.g. one episode per file from LeRobot): never appended to
    return _moov_key(moov)


def _prefix_end(head: bytes) -> int:
    """Length of the complete boxes at the start of ``head``."""
    pos = 0
    while pos + 8 <= len(head):
        size = struct.unpack(">I", head[pos : pos + 4])[0]
        if size == 1 and pos + 16 <= len(head):
            size = struct.unpack(">Q", head[pos + 8 : pos + 16])[0]
        if size < 8 or pos + size > len(head):
            break
        pos += size
    return pos


def write_new(path: Path, frag: Fragmented) -> None:
    with open(path, "wb") as fh:
        fh.write(frag.header)
        fh.write(frag.shifted(0, 1))
        fh.flush()
        os.fsync(fh.fileno())


def append(path: Path, frag: Fragmented, start_ticks: int, first_sequence: int) -> None:
    """Append the episode's fragments at ``start_ticks`` (the caller journals the old length)."""
    with open(path, "ab") as fh:
        fh.write(frag.shifted(start_ticks, first_sequence))
        fh.flush()
        os.fsync(fh.fileno())


def truncate(path: Path, length: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(length)
        fh.flush()
        os.fsync(fh.fileno())
