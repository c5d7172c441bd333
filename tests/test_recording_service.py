"""Recording under systemd, seen from a fake NOTIFY_SOCKET (`so101d run` subprocess, emulated arms):

- READY=1 is sent only once the recorder accepts episodes (until then STATUS= says
  "recording: starting"): the first episode.start right after READY succeeds;
- SIGTERM mid-episode with [recording] on_shutdown = "save" (the default): the episode in progress
  is in the dataset, tagged "saved at shutdown"; the Feetech follower on our emulator is tagged
  "emulated". (The "discard" path is test_service_daemon.py's SIGTERM test.)
"""

from __future__ import annotations

import signal
import time

import pytest
from recording_support import load_dataset
from test_service_daemon import _start_daemon, _stop, systemd_bench  # noqa: F401 - a fixture

from daemon.api.client import ControlClient
from daemon.data.schema import read_episode_tags

pytestmark = pytest.mark.e2e  # the daemon as a service with a recorder


def test_ready_waits_for_the_recorder_and_sigterm_saves_the_episode_in_progress(systemd_bench) -> None:
    root, fake = systemd_bench
    data = root / "datasets"
    proc, _cfg, sock = _start_daemon(
        root,
        fake,
        f'[recording]\nenabled = true\ndataset_root = "{data}"\nrepo_id = "local/svc"\nfps = 30\n'
        '[cameras.front]\nkind = "virtual"\nwidth = 160\nheight = 120\n',
    )
    out = ""
    try:
        fake.wait_for("READY=1", timeout_s=180)
        t_ready = next(t for t, m in fake.messages if "READY=1" in m)
        before = [line for t, m in fake.messages if t < t_ready for line in m if line.startswith("STATUS=")]
        # the arms connect in well under a second; the writer process needs seconds to import
        assert any("recording: starting" in s for s in before), before
        with ControlClient(sock, timeout_s=10) as c:
            r = c.call("episode.start", task="right after READY")
            assert r.get("ok") is True, r  # no retry loop: READY means the recorder is ready
            end = time.monotonic() + 60
            while c.request("episode.status")["frames"] < 15:
                assert time.monotonic() < end, "no frames recorded"
                time.sleep(0.1)
            first = c.request("episode.save", success=True)
            c.request("episode.start", task="in progress at SIGTERM")
            end = time.monotonic() + 60
            while c.request("episode.status")["frames"] < 10:
                assert time.monotonic() < end, "no frames recorded in the second episode"
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        out = _stop(proc)
    ds_root = data / "local" / "svc"
    ds = load_dataset(ds_root, "local/svc")
    assert ds.meta.total_episodes == 2, out[-3000:]
    assert ds.meta.episodes[0]["length"] == first["frames"]
    assert ds.meta.episodes[1]["length"] >= 10
    assert list(ds.meta.episodes[1]["tasks"]) == ["in progress at SIGTERM"]
    tags = read_episode_tags(ds_root)
    assert tags[0].success is True and tags[0].notes == []
    assert tags[1].success is None and "saved at shutdown (daemon stopping)" in tags[1].notes
    assert {tags[0].follower_kind, tags[1].follower_kind} == {"emulated"}
    assert "episode 1 in progress saved" in out
