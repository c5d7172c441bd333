"""The console tests' bench: emulated arms (`so101d emulate`), `so101d run` on the virtual bench's
configuration (two virtual cameras, recording on), `so101d console`, and a headless Chromium.

Everything is a real process started the way an operator starts it; the browser is Debian's
chromium driven by Selenium through /usr/bin/chromedriver (installed by `make test`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from support import free_port, wait_status

from daemon.api.client import ControlClient
from daemon.apps.commands.demo import prepare_bench
from drivers.emulator.process import EmulatorProcess

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1100",
)


def browser_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: `make test` installs chromium and chromium-driver"
    return None


class Bench:
    """Emulator + daemon + console, each its own process, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.sock = directory / "control.sock"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.emulator = EmulatorProcess(directory, wire_time=False)
        self.daemon: subprocess.Popen[bytes] | None = None
        self.console: subprocess.Popen[bytes] | None = None
        self.env = dict(os.environ, HF_HUB_OFFLINE="1")

    def start(self) -> Bench:
        self.emulator.start()
        self.cfg, _ = prepare_bench(self.dir, socket_path=str(self.sock), dataset_root=self.dir / "datasets")
        self.dataset = self.dir / "datasets" / self.cfg.recording.repo_id
        # a pre-roll buffer of 5 s (the page's Keep): 150 frames of two 320x240 cameras, 66 MiB at most
        toml = self.dir / "so101d.toml"
        toml.write_text(re.sub(r"(?m)^ring_s = .*$", "ring_s = 5", toml.read_text(), count=1))
        self.start_daemon()
        with open(self.dir / "console.log", "wb") as log:
            self.console = subprocess.Popen(
                [sys.executable, "-m", "daemon.apps.cli", "console", "--bind", f"127.0.0.1:{self.port}"]
                + ["--socket", str(self.sock)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self.wait_recorder_ready()
        return self

    def start_daemon(self) -> None:
        with open(self.dir / "daemon.log", "ab") as log:
            self.daemon = subprocess.Popen(
                [sys.executable, "-m", "daemon.apps.cli", "run", "--config", str(self.dir / "so101d.toml")],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )

    def wait_recorder_ready(self, timeout_s: float = 90.0) -> dict[str, Any]:
        """The recorder idle and the follower tracking. On a machine loaded enough that a servo
        reply came late at start-up, the daemon latches "not answering": cleared as an operator
        would (`so101d teleop start`) once the servos answer again."""

        def ready(st: dict[str, Any]) -> bool:
            if st["mode"] == "fault" and not st["safety"]["fault_now"]:
                with ControlClient(self.sock) as c:
                    c.call("teleop.start")
            return (st.get("recording") or {}).get("phase") == "idle" and st["mode"] == "teleop"

        return wait_status(self.sock, ready, timeout_s=timeout_s, proc=self.daemon)

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            self.daemon.wait(60)

    def close(self) -> None:
        for proc in (self.console, self.daemon):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self.emulator.stop()

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n" + (self.dir / name).read_text(errors="replace")[-4000:]
            for name in ("daemon.log", "console.log")
            if (self.dir / name).exists()
        )


def open_browser(*extra_flags: str) -> Any:
    """Headless Chromium; ``extra_flags`` e.g. ``--host-resolver-rules=MAP evil.example 127.0.0.1``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, *extra_flags):
        opts.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="so101d-chromium-")
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.so101d_profile = profile
    return driver


def close_browser(driver: Any) -> None:
    profile = getattr(driver, "so101d_profile", None)
    driver.quit()
    if profile:
        shutil.rmtree(profile, ignore_errors=True)


def wait_js(driver: Any, script: str, timeout_s: float = 20.0, what: str = "") -> Any:
    """Poll a JS expression (``return ...``) until it is truthy; its value."""
    end = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < end:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.1)
    shown = driver.execute_script(
        "const t = (id) => (document.getElementById(id) || {}).textContent;"
        "return {message: t('message'), mode: t('mode'), banner: t('link-banner'), phase: t('rec-phase'),"
        " countdown: t('countdown'), count: t('rec-count')}"
    )
    raise AssertionError(f"page never showed {what or script!r}; last value {value!r}; the page shows {shown}")


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """Errors the page logged (uncaught exceptions, failed loads) since the last call."""
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
