"""`policy.load PATH` from a request: the path is resolved and checked before the daemon looks
inside. Another user's private folder is "not allowed" (no names, no hint whether it exists); a
folder that is no checkpoint is said to be one without a walk; the walk itself is bounded. On a
real `so101d run`, over its control socket."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from security_support import intruder, no_intruder_reason, running_daemon

from daemon.api.client import ControlClient
from daemon.policy.checkpoint import MAX_WALK_ENTRIES


@pytest.fixture(scope="module")
def other_user() -> tuple[int, int]:
    ids = intruder()
    if ids is None:
        pytest.skip(no_intruder_reason())
    return ids


@pytest.fixture(scope="module")
def private_folder(other_user: tuple[int, int]) -> Iterator[Path]:
    """Another user's home-like folder, mode 0700, holding pickle-suffixed files and a checkpoint."""
    uid, gid = other_user
    with tempfile.TemporaryDirectory(prefix="so101d-home-") as d:
        home = Path(d) / "home"
        (home / "ckpt").mkdir(parents=True)
        (home / "ckpt" / "config.json").write_text("{}")
        (home / "ckpt" / "weights-of-bob.pkl").write_bytes(b"\x80\x04")
        (home / "diary-2026.pt").write_bytes(b"\x80\x04")
        for p in (home, home / "ckpt", *(home / "ckpt").iterdir(), home / "diary-2026.pt"):
            os.chown(p, uid, gid)
        os.chmod(home, 0o700)
        yield home


@pytest.fixture(scope="module")
def daemon(private_folder: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="so101d-") as d:
        allowed = Path(d) / "policies"
        (allowed / "shared").mkdir(parents=True)
        os.chown(allowed, 65534, 65534)  # not the daemon's: allowed by the configuration only
        os.chown(allowed / "shared", 65534, 65534)
        toml = f'[policy]\nallowed_dirs = ["{allowed}"]\n'
        with running_daemon(Path(d), toml) as (sock, _proc):
            yield sock


def _load(sock: Path, path: str | Path) -> dict[str, object]:
    with ControlClient(sock, timeout_s=30) as c:
        return c.call("policy.load", path=str(path))


@pytest.mark.parametrize("inside", ["", "ckpt", "no-such-thing", "ckpt/../ckpt"])
def test_another_users_private_folder_is_not_allowed_and_nothing_is_named(
    daemon: Path, private_folder: Path, inside: str
) -> None:
    r = _load(daemon, private_folder / inside if inside else private_folder)
    assert r["ok"] is False and "is not allowed" in str(r["error"]), r
    for secret in ("weights-of-bob", "diary-2026", "config.json", "does not exist", "missing"):
        assert secret not in str(r["error"])


def test_a_folder_that_is_no_checkpoint_is_said_so_without_a_walk(daemon: Path) -> None:
    r = _load(daemon, "/")  # the daemon's user (root here) owns "/": allowed, but no checkpoint
    assert r["ok"] is False and "is not a checkpoint: it has no config.json" in str(r["error"]), r


def test_the_walk_through_an_allowed_folder_is_bounded(daemon: Path, tmp_path: Path) -> None:
    big = tmp_path / "big"
    (big / "a" / "b").mkdir(parents=True)
    (big / "config.json").write_text("{}")
    for i in range(MAX_WALK_ENTRIES + 1):
        (big / "a" / "b" / f"f{i}.txt").touch()
    r = _load(daemon, big)
    assert r["ok"] is False and f"more than {MAX_WALK_ENTRIES} entries" in str(r["error"]), r


def test_a_configured_folder_is_allowed_and_looked_into(daemon: Path) -> None:
    with ControlClient(daemon) as c:
        allowed = Path(str(c.request("status")["config"])).parent / "policies" / "shared"
    (allowed / "config.json").write_text("{}")
    (allowed / "model.ckpt").write_bytes(b"\x80\x04")
    r = _load(daemon, allowed)
    assert r["ok"] is False and "model.ckpt" in str(r["error"]) and "only safetensors" in str(r["error"]), r
