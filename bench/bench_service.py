"""What the systemd integration costs the control loop, measured side by side in one run.

The loop calls WatchdogGate.progress() every cycle; it must cost a small fraction of a 10 ms
(100 Hz) cycle. Compares: a bare Python call, progress() with no watchdog (outside systemd),
progress() armed (a datagram at most every period/2), and one sd_notify datagram.
"""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path

from daemon.system.sd_notify import Notifier, WatchdogGate

N = 200_000


def per_call_ns(fn, n: int = N) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "notify.sock")
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        rx.bind(path)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        rx.setblocking(False)

        def drain() -> None:
            try:
                while True:
                    rx.recv(4096)
            except BlockingIOError:
                pass

        def bare() -> None:
            pass

        off = WatchdogGate(Notifier.from_env({}))
        armed = WatchdogGate(Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "5000000"}))
        raw = Notifier.from_env({"NOTIFY_SOCKET": path})

        base = per_call_ns(bare)
        t_off = per_call_ns(off.progress)
        t_armed = per_call_ns(armed.progress)
        drain()
        sends = 20_000
        t0 = time.perf_counter_ns()
        for i in range(sends):
            raw.watchdog()
            if i % 5 == 0:
                drain()
        t_send = (time.perf_counter_ns() - t0) / sends
        drain()
        rx.close()

    cycle_ns = 10e6  # 100 Hz
    print(f"bare python call            {base:8.0f} ns")
    print(f"gate.progress(), no systemd {t_off:8.0f} ns  ({t_off / base:.1f}x bare call)")
    print(
        f"gate.progress(), armed      {t_armed:8.0f} ns  ({t_armed / base:.1f}x bare call, {armed.pets} pets in {N} cycles)"
    )
    print(f"one WATCHDOG=1 datagram     {t_send:8.0f} ns  ({t_send / t_armed:.0f}x an armed progress() call)")
    print(f"armed progress() share of a 100 Hz cycle: {100 * t_armed / cycle_ns:.4f} %")


if __name__ == "__main__":
    main()
