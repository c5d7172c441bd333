"""A foreground `so101d run` in a real terminal: the operator closes the window, or signals it.

The daemon runs as a job of an interactive bash on a pseudo-terminal, the way an operator types
it; its stderr goes to a file so the test can read what it said after the terminal is gone.
Closing the terminal (the pty master) makes bash send SIGHUP to the job's whole process group,
helpers included.
"""

from __future__ import annotations

import os
import pty
import select
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from support import poll_until, wait_status

from daemon.api.client import ControlClient
from daemon.apps.commands.demo import prepare_bench
from daemon.data.demo_session import episodes_on_disk
from daemon.service.attach_recording import dataset_root
from drivers.emulator.process import EmulatorProcess

REPO = Path(__file__).resolve().parents[1]


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(d.name))
    return out


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _shm_segments(pid: int) -> set[str]:
    """Shared-memory segments a process has mapped (the recorder's ring)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {line.split()[-1] for line in maps.splitlines() if "/dev/shm/" in line}


class Terminal:
    """An interactive bash on a pseudo-terminal (job control on), like a terminal window."""

    def __init__(self, cwd: Path) -> None:
        env = dict(os.environ, PS1="$ ", TERM="dumb", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
        pid, fd = pty.fork()
        if pid == 0:  # child: the shell, session leader with the pty as controlling terminal
            # A terminal window's shell starts with the terminal's signals at their defaults, even
            # when the test run itself was started under nohup (SIGHUP ignored, inherited).
            for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            os.chdir(cwd)
            os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], env)
        self.shell_pid, self.fd = pid, fd
        self.closed = False
        self._lock = threading.Lock()
        # a terminal window keeps reading what is drawn on it (else the live table would block)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            with self._lock:
                if self.closed:
                    return
                try:
                    if select.select([self.fd], [], [], 0)[0]:
                        os.read(self.fd, 65536)
                except OSError:
                    pass
            time.sleep(0.05)

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def close_window(self) -> None:
        """What closing a terminal window does: the master side goes away."""
        with self._lock:
            if not self.closed:
                self.closed = True
                os.close(self.fd)

    def session(self) -> list[int]:
        """Every process still in the window's session (what a failed test must not leave running)."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == self.shell_pid and int(stat.parent.name) != self.shell_pid:
                pids.append(int(stat.parent.name))
        return pids

    def reap(self) -> None:
        self.close_window()
        if not poll_until(lambda: os.waitpid(self.shell_pid, os.WNOHANG)[0] != 0, 10):
            os.kill(self.shell_pid, signal.SIGKILL)
            os.waitpid(self.shell_pid, 0)
        # After a passing test the session is empty; after a failing one its daemon, demo or
        # emulator would run on, loading the machine for every later test.
        for pid in self.session():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def bench(tmp_path: Path):
    """Emulated arms and a bench configuration with recording on; the daemon is the test's to run."""
    run_dir = tmp_path / "bench"
    run_dir.mkdir()
    sock = tmp_path / "so101d.sock"
    cfg, _ = prepare_bench(run_dir, socket_path=str(sock), dataset_root=tmp_path / "datasets")
    emu = EmulatorProcess(run_dir, leader_motion="demo").start()
    try:
        yield run_dir, sock, cfg
    finally:
        emu.stop()


def _start_foreground_run(term: Terminal, run_dir: Path, sock: Path, err: Path, prefix: str = "") -> tuple[int, dict]:
    cmd = (
        f"{prefix}{shlex.quote(sys.executable)} -m daemon.apps.cli run --config {shlex.quote(str(run_dir / 'so101d.toml'))}"
        f" 2>{shlex.quote(str(err))}\n"
    )
    term.type(cmd)
    st = wait_status(sock, lambda s: (s.get("recording") or {}).get("phase") == "idle", timeout_s=180)
    daemons = [p for p in children(term.shell_pid) if "daemon.apps.cli run" in cmdline(p)]
    assert len(daemons) == 1, [cmdline(p) for p in children(term.shell_pid)]
    return daemons[0], st


TERMINAL_SIGNALS_MASK = (1 << (signal.SIGHUP - 1)) | (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGQUIT - 1))


def _blocked(pid: int, tid: int | None = None, field: str = "SigBlk") -> int:
    """The signal mask (SigBlk) or ignored set (SigIgn) of a process or one of its threads."""
    where = Path(f"/proc/{pid}") / ("task/" + str(tid) if tid else "")
    line = next(ln for ln in (where / "status").read_text().splitlines() if ln.startswith(field + ":"))
    return int(line.split()[1], 16)


def _immune(pid: int) -> bool:
    """Each of the terminal's signals is blocked or ignored (the tracker ignores SIGINT itself)."""
    return (_blocked(pid) | _blocked(pid, field="SigIgn")) & TERMINAL_SIGNALS_MASK == TERMINAL_SIGNALS_MASK


def _start_ticks(stat_path: Path) -> int:
    """When a process or thread started (clock ticks since boot; unlike ids, never wraps)."""
    return int(stat_path.read_text().rsplit(")", 1)[1].split()[19])


def _threads_without_the_shield(pid: int, since: int) -> list[int]:
    """Threads started after ``since`` (the daemon's start) that could still start a helper
    exposed to the terminal. Threads from before (a BLAS pool created at import) start none."""
    bad = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        tid = int(task.name)
        if (
            tid != pid
            and _start_ticks(task / "stat") > since
            and _blocked(pid, tid) & TERMINAL_SIGNALS_MASK != TERMINAL_SIGNALS_MASK
        ):
            bad.append(tid)
    return bad


def _helpers(daemon_pid: int) -> dict[str, int]:
    """The daemon's helper processes by role (the emulator is not ours here: the test runs it)."""
    roles = {}
    for pid in descendants(daemon_pid):
        cmd = cmdline(pid)
        if "resource_tracker" in cmd:
            roles["resource tracker"] = pid
        elif "multiprocessing.spawn" in cmd or "spawn_main" in cmd:
            roles.setdefault("writer", pid)
    return roles


def _record_one_episode(sock: Path) -> None:
    with ControlClient(sock, timeout_s=5) as c:
        assert c.request("episode.start", task="terminal test").get("ok")
        assert poll_until(lambda: c.request("episode.status")["frames"] >= 15, 60), c.request("episode.status")
        reply = c.request("episode.save", success=True)
        assert reply.get("ok"), reply


def test_closing_the_terminal_stops_the_daemon_cleanly_and_keeps_the_saved_episode(bench, tmp_path: Path) -> None:
    run_dir, sock, cfg = bench
    err = tmp_path / "daemon.err"
    term = Terminal(tmp_path)
    try:
        daemon_pid, _ = _start_foreground_run(term, run_dir, sock, err)
        helpers = _helpers(daemon_pid)
        assert {"resource tracker", "writer"} <= set(helpers), helpers
        segments = _shm_segments(daemon_pid)
        assert segments, "the recorder's ring should be in shared memory"
        _record_one_episode(sock)

        term.close_window()

        assert poll_until(lambda: not alive(daemon_pid), 120), "the daemon kept running after its terminal closed"
        text = err.read_text()
        assert "terminal closed" in text, text[-3000:]
        assert "Traceback" not in text and "KeyError" not in text, text[-5000:]
        assert poll_until(lambda: not any(alive(p) for p in helpers.values()), 20), {
            role: pid for role, pid in helpers.items() if alive(pid)
        }
        leaked = [s for s in segments if Path(s).exists()]
        assert not leaked, f"shared memory left behind: {leaked}"
        assert episodes_on_disk(dataset_root(cfg.recording)) == 1, text[-3000:]
    finally:
        term.reap()


def test_sighup_with_the_terminal_open_reloads_and_spares_the_helpers(bench, tmp_path: Path) -> None:
    """`kill -HUP` to the job's process group while the terminal is open: a reload. The helpers
    are in that group too and must not die of it; Ctrl-C afterwards stops everything cleanly."""
    run_dir, sock, _ = bench
    err = tmp_path / "daemon.err"
    term = Terminal(tmp_path)
    try:
        daemon_pid, st = _start_foreground_run(term, run_dir, sock, err)
        helpers = _helpers(daemon_pid)
        assert {"resource tracker", "writer"} <= set(helpers), helpers
        segments = _shm_segments(daemon_pid)
        reloads = st["reloads"]
        # the helpers, and every thread that may start one later (a policy worker is spawned from
        # a control-socket thread), keep the terminal's signals blocked; the main thread takes them
        assert all(_immune(p) for p in helpers.values()), {r: _immune(p) for r, p in helpers.items()}
        started = _start_ticks(Path(f"/proc/{helpers['resource tracker']}/stat"))  # inside the shield
        assert _threads_without_the_shield(daemon_pid, since=started) == []
        assert _blocked(daemon_pid) & TERMINAL_SIGNALS_MASK == 0

        os.killpg(os.getpgid(daemon_pid), signal.SIGHUP)

        wait_status(sock, lambda s: s["reloads"] == reloads + 1, timeout_s=20)
        time.sleep(0.5)  # a helper killed by the signal would be gone by now
        assert all(alive(p) for p in helpers.values()), {r: alive(p) for r, p in helpers.items()}
        assert alive(daemon_pid)

        term.type("\x03")  # Ctrl-C at the terminal: SIGINT to the foreground job

        assert poll_until(lambda: not alive(daemon_pid), 120), "Ctrl-C did not stop the daemon"
        text = err.read_text()
        assert "Traceback" not in text and "KeyError" not in text, text[-5000:]
        assert "daemon stopped" in text, text[-3000:]
        assert poll_until(lambda: not any(alive(p) for p in helpers.values()), 20)
        leaked = [s for s in segments if Path(s).exists()]
        assert not leaked, f"shared memory left behind: {leaked}"
    finally:
        term.reap()


def test_a_daemon_that_cannot_start_leaves_no_helper_or_shared_memory_behind(bench, tmp_path: Path) -> None:
    """The recorder (writer process, shared-memory ring) starts before the control socket; when
    the socket is taken the start fails, and what was started must be stopped, not leaked."""
    import socket
    import subprocess

    run_dir, sock, _ = bench
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    squatter.bind(str(sock))
    squatter.listen(1)
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
        proc = subprocess.run(
            [sys.executable, "-m", "daemon.apps.cli", "run", "--config", str(run_dir / "so101d.toml")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        squatter.close()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "cannot start" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-5000:]
    # the resource tracker would have to clean up (and say so) for any segment left behind
    assert "leaked" not in proc.stderr, proc.stderr[-3000:]


def test_closing_the_terminal_of_a_live_demo_stops_it_and_its_emulator(tmp_path: Path) -> None:
    """`so101d demo` draws its live table on the terminal; the window is closed mid-recording."""
    run_dir, sock, err = tmp_path / "bench", tmp_path / "d.sock", tmp_path / "demo.err"
    term = Terminal(tmp_path)
    try:
        term.type(
            f"{shlex.quote(sys.executable)} -m daemon.apps.cli demo --dir {run_dir} --socket {sock} --record 3"
            f" --episode-time 3 2>{err}\n"
        )
        wait_status(sock, lambda s: (s.get("recording") or {}).get("phase") == "recording", timeout_s=180)
        demos = [p for p in children(term.shell_pid) if "daemon.apps.cli demo" in cmdline(p)]
        assert len(demos) == 1
        ours = descendants(demos[0])
        assert any("emulate" in cmdline(p) for p in ours) and any("resource_tracker" in cmdline(p) for p in ours)
        segments = _shm_segments(demos[0])

        term.close_window()

        assert poll_until(lambda: not alive(demos[0]), 120), "the demo kept running after its terminal closed"
        assert poll_until(lambda: not any(alive(p) for p in ours), 20), {p: cmdline(p) for p in ours if alive(p)}
        text = err.read_text()
        assert "Traceback" not in text and "KeyError" not in text, text[-5000:]
        assert not [s for s in segments if Path(s).exists()]
        assert not (run_dir / "leader").exists()  # the emulator was stopped, its links removed
    finally:
        term.reap()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_shared_memory_is_released_when_the_daemon_is_stopped_or_killed(bench, tmp_path: Path, how: str) -> None:
    """systemd's stop (SIGTERM) and the OOM killer (SIGKILL): no segment of the recorder's ring is
    left in /dev/shm, the writer does not outlive the daemon. With SIGKILL the daemon cannot clean
    up: the resource tracker (which outlives it) does."""
    import subprocess

    run_dir, sock, _ = bench
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    with open(tmp_path / "daemon.err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon.apps.cli", "run", "--config", str(run_dir / "so101d.toml")],
            env=env,
            stderr=err,
            start_new_session=True,
        )
    try:
        wait_status(sock, lambda s: (s.get("recording") or {}).get("phase") == "idle", timeout_s=180)
        helpers = _helpers(proc.pid)
        assert {"resource tracker", "writer"} <= set(helpers), helpers
        segments = _shm_segments(proc.pid)
        assert segments

        proc.send_signal(getattr(signal, how))
        rc = proc.wait(timeout=120)

        assert rc == (0 if how == "SIGTERM" else -signal.SIGKILL)
        assert poll_until(lambda: not any(alive(p) for p in helpers.values()), 30), {
            role: pid for role, pid in helpers.items() if alive(pid)
        }
        assert not [s for s in segments if Path(s).exists()], "shared memory left behind"
        if how == "SIGTERM":
            text = (tmp_path / "daemon.err").read_text()
            assert "Traceback" not in text and "leaked" not in text, text[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_under_nohup_the_daemon_outlives_its_terminal(bench, tmp_path: Path) -> None:
    """`nohup so101d run ...`: the operator asked for the daemon to survive the hang-up."""
    run_dir, sock, _ = bench
    err = tmp_path / "daemon.err"
    term = Terminal(tmp_path)
    daemon_pid = 0
    try:
        daemon_pid, _ = _start_foreground_run(term, run_dir, sock, err, prefix="nohup ")
        term.close_window()
        assert poll_until(lambda: "running on" in err.read_text(), 30), err.read_text()[-3000:]
        st = wait_status(sock, lambda s: s["mode"] in ("teleop", "aligning", "hold"), timeout_s=10)
        assert st["reloads"] == 0 and alive(daemon_pid)

        os.kill(daemon_pid, signal.SIGTERM)

        assert poll_until(lambda: not alive(daemon_pid), 120)
        text = err.read_text()
        assert "daemon stopped" in text and "Traceback" not in text, text[-3000:]
    finally:
        if daemon_pid and alive(daemon_pid):
            os.kill(daemon_pid, signal.SIGKILL)
        term.reap()
