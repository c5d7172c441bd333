"""USB bandwidth of camera streams: will the configured cameras fit one USB 2 bus?

An estimate, from the stream's format, size and rate, of what a UVC camera *reserves* on the bus
(isochronous bandwidth is reserved when the stream starts; a stream that does not fit fails to
start or, on some drivers, silently drops to a lower rate):

- a USB 2 (high-speed) bus has 480 Mbit/s; periodic (isochronous) transfers may use 80% of each
  microframe: 48 MB/s for all cameras on the bus together;
- a UVC camera picks the smallest alternate setting whose packet carries its stream; the usual
  high-bandwidth settings carry 1, 2 or 3 packets of 1024 bytes per 125 us microframe: 8.192,
  16.384 or 24.576 MB/s (the last is the most one camera can ever get on USB 2);
- uncompressed YUYV is 2 bytes per pixel; MJPG is estimated at a fifth of that (JPEG frames vary
  with the scene: a busy scene compresses less). A compressed stream whose estimate exceeds the
  largest setting is not "too big": the camera compresses into what it gets (USB 2 webcams send
  1080p30 MJPG), so it reserves the largest setting.
"""

from __future__ import annotations

from dataclasses import dataclass

USB2_PERIODIC_MB_S = 48.0
UVC_ALT_SETTINGS_MB_S = (8.192, 16.384, 24.576)
BYTES_PER_PIXEL = {"YUYV": 2.0, "UYVY": 2.0, "NV12": 1.5, "YU12": 1.5, "GREY": 1.0, "RGB3": 3.0, "BGR3": 3.0}
MJPG_SHARE_OF_YUYV = 0.2
COMPRESSED = ("MJPG", "JPEG", "H264", "HEVC")


@dataclass(frozen=True)
class Stream:
    name: str
    width: int
    height: int
    fps: float
    fourcc: str  # "" = the camera's default: most UVC cameras then send YUYV

    @property
    def format(self) -> str:
        return self.fourcc or "YUYV"

    @property
    def compressed(self) -> bool:
        return self.format in COMPRESSED

    def payload_mb_s(self, fourcc: str | None = None) -> float:
        fmt = fourcc or self.format
        bpp = 2.0 * MJPG_SHARE_OF_YUYV if fmt in COMPRESSED else BYTES_PER_PIXEL.get(fmt, 2.0)
        return self.width * self.height * bpp * self.fps / 1e6

    def reserved_mb_s(self, fourcc: str | None = None) -> float:
        """What the camera reserves: the smallest alternate setting that carries it; more than the
        largest (a stream one camera cannot carry on USB 2) counts as what it asks."""
        need = self.payload_mb_s(fourcc)
        if (fourcc or self.format) in COMPRESSED:
            need = min(need, UVC_ALT_SETTINGS_MB_S[-1])
        return next((alt for alt in UVC_ALT_SETTINGS_MB_S if alt >= need), need)


@dataclass(frozen=True)
class BusEstimate:
    streams: tuple[Stream, ...]
    reserved_mb_s: float
    reserved_if_mjpg_mb_s: float
    too_big: tuple[str, ...]  # streams one USB 2 camera cannot carry at all

    @property
    def fits(self) -> bool:
        return self.reserved_mb_s <= USB2_PERIODIC_MB_S and not self.too_big

    @property
    def mjpg_fits(self) -> bool:
        return self.reserved_if_mjpg_mb_s <= USB2_PERIODIC_MB_S


def estimate(streams: list[Stream]) -> BusEstimate:
    """All the streams on one USB 2 bus."""
    reserved = sum(s.reserved_mb_s() for s in streams)
    as_mjpg = sum(s.reserved_mb_s("MJPG") for s in streams)
    too_big = tuple(s.name for s in streams if not s.compressed and s.payload_mb_s() > UVC_ALT_SETTINGS_MB_S[-1])
    return BusEstimate(tuple(streams), round(reserved, 3), round(as_mjpg, 3), too_big)


def advice(est: BusEstimate) -> tuple[str, str]:
    """(PASS | WARN | FAIL, the sentence): what the operator reads in `so101d doctor`."""
    parts = ", ".join(
        f"{s.name} {s.width}x{s.height}@{s.fps:g} {s.format} ~{s.reserved_mb_s():.1f} MB/s" for s in est.streams
    )
    head = f"{parts}: {est.reserved_mb_s:.1f} of {USB2_PERIODIC_MB_S:g} MB/s of one USB 2 bus (estimate)"
    if est.fits:
        return "PASS", head
    if est.too_big:
        why = f"{', '.join(est.too_big)} cannot be carried by one USB 2 camera as configured"
    elif any(not s.compressed for s in est.streams):
        why = "uncompressed streams will not fit one USB 2 bus"
    else:
        why = "these streams will not fit one USB 2 bus"
    if est.mjpg_fits:
        return "FAIL", f'{head}; {why}: set fourcc = "MJPG" (then ~{est.reserved_if_mjpg_mb_s:.1f} MB/s fits)'
    return "FAIL", (
        f"{head}; {why}, even as MJPG (~{est.reserved_if_mjpg_mb_s:.1f} MB/s): "
        "lower the size or rate, or put the cameras on separate USB buses"
    )
