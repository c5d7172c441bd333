"""How close the STS3215 emulator's timing is to a real bus, and what it costs.

Runs ``so101d emulate`` in a subprocess (its own GIL and a real-time serving thread) and talks to
the follower with a minimal raw pyserial client (blocking reads: no SDK busy-polling), so the
numbers are the emulator's, not a client's. Side by side in one run:

- six-servo sync read of Present_Position (14-byte request + 6 x 8-byte replies = 62 bytes):
  round trip with wire time modelled vs the wire-time floor (0.62 ms at 1 Mbaud, 10 bits/byte),
  and with --no-wire-time (the emulator's own processing + pty cost);
- six-goal sync write (26 bytes, no reply) followed by a ping (6 + 6 bytes) to time its completion;
- the emulator's own counters: replies later than 0.5 ms after their deadline, worst lateness;
- CPU used by the emulator process during a 100 Hz sync-read loop, and while idle.

    .venv/bin/python bench/bench_emulator.py [--iterations N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import serial

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drivers import protocol as P
from drivers.emulator.process import EmulatorProcess

BAUD = 1_000_000
IDS = [1, 2, 3, 4, 5, 6]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _transact(ser: serial.Serial, request: bytes, reply_len: int) -> float | None:
    t0 = time.perf_counter()
    ser.write(request)
    data = ser.read(reply_len)
    dt = time.perf_counter() - t0
    if len(data) != reply_len:
        ser.reset_input_buffer()
        return None
    return dt


def _measure(path: Path, iterations: int) -> dict[str, np.ndarray | int]:
    ser = serial.Serial(str(path), BAUD, timeout=0.2)
    ser.reset_input_buffer()
    read_req = P.sync_read(56, 2, IDS)
    write_req = P.sync_write(42, 2, {i: P.le_bytes(2048, 2) for i in IDS})
    ping_req = P.ping(1)
    reads, writes, fails = [], [], 0
    for _ in range(20):  # warm-up
        _transact(ser, read_req, 6 * 8)
    for _ in range(iterations):
        dt = _transact(ser, read_req, 6 * 8)
        if dt is None:
            fails += 1
        else:
            reads.append(dt)
        # Sync write has no reply: time it to the end of a following ping's reply (the bus is
        # half duplex, so the ping's answer cannot come before the write left the wire).
        t0 = time.perf_counter()
        ser.write(write_req)
        dt = _transact(ser, ping_req, 6)
        if dt is None:
            fails += 1
        else:
            writes.append(time.perf_counter() - t0)
    ser.close()
    return {"read": np.array(reads) * 1e3, "write": np.array(writes) * 1e3, "fails": fails}


def _loop_cpu(path: Path, pid: int, seconds: float) -> float:
    ser = serial.Serial(str(path), BAUD, timeout=0.2)
    req = P.sync_read(56, 2, IDS)
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    next_t = t0
    while time.monotonic() - t0 < seconds:
        _transact(ser, req, 48)
        next_t += 0.01
        time.sleep(max(0.0, next_t - time.monotonic()))
    ser.close()
    return (_cpu_s(pid) - cpu0) / (time.monotonic() - t0) * 100.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=1000)
    args = ap.parse_args()
    wire_read_ms = P.wire_time_s(14 + 6 * 8, BAUD) * 1e3
    wire_write_ms = P.wire_time_s(26 + 6 + 6, BAUD) * 1e3
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_emulator_") as tmp:
        for label, wire in (("wire time", True), ("no wire time", False)):
            with EmulatorProcess(Path(tmp) / label.replace(" ", "_"), leader=False, wire_time=wire) as ep:
                assert ep.follower_path is not None and ep.pid is not None
                res = _measure(ep.follower_path, args.iterations)
                stats = ep.control({"cmd": "stats"})["stats"]
                cpu_loop = _loop_cpu(ep.follower_path, ep.pid, 2.0) if wire else float("nan")
                cpu_idle0 = _cpu_s(ep.pid)
                time.sleep(1.0)
                cpu_idle = (_cpu_s(ep.pid) - cpu_idle0) * 100.0
                rows.append((label, res, stats, cpu_loop, cpu_idle))

    print(f"STS3215 emulator timing, {args.iterations} iterations, raw pyserial client, emulator in a subprocess")
    print(
        f"wire-time floor at 1 Mbaud: sync read {wire_read_ms:.3f} ms (62 B), sync write + ping {wire_write_ms:.3f} ms (26 + 6 + 6 B)\n"
    )
    print(f"{'mode':<14}{'op':<12}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'p50/wire':>10}{'fails':>7}")
    for label, res, _stats, _c, _i in rows:
        for op, floor in (("sync read", wire_read_ms), ("write+ping", wire_write_ms)):
            a = res["read" if op == "sync read" else "write"]
            assert isinstance(a, np.ndarray)
            if not len(a):
                print(f"{label:<14}{op:<12}{'-':>9}")
                continue
            p50, p99, mx = np.percentile(a, 50), np.percentile(a, 99), a.max()
            print(f"{label:<14}{op:<12}{p50:9.3f}{p99:9.3f}{mx:9.2f}{p50 / floor:10.2f}{res['fails']:7d}")
    print()
    for label, _res, stats, cpu_loop, cpu_idle in rows:
        print(
            f"{label:<14}late replies {stats['late_replies']} (> 0.5 ms), worst lateness "
            f"{stats['max_lateness_s'] * 1e3:.3f} ms, stale dropped {stats['stale_dropped']}; "
            f"emulator CPU: idle {cpu_idle:.1f} %"
            + ("" if cpu_loop != cpu_loop else f", 100 Hz sync-read loop {cpu_loop:.1f} %")
        )
    print("\n'no wire time' p50 is the emulator's own processing + pty round trip (the floor any client sees).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
