"""What an outside test of the hardened control path still got through, each case cheap:

- a console client that closed its end at once was taken for root (a closed TCP end shows uid 0);
- a request with a key given twice was read by its last copy (`"cmd":"hold","cmd":"torque.off"`);
- refusals named Python types, let a NUL reach the file system, took any frame number;
- the console answered to every loopback literal, not only its bind address;
- policy.load read through a link out of the checkpoint folder and quoted what it read, called a
  FIFO "does not exist", and walked any number of folders;
- `so101d status` did not show that the control socket's serving thread had been restarted.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from daemon.api.bounded_json import JsonRefused, loads_bounded
from daemon.api.client import ControlClient
from daemon.api.requests import BadField, parse_request
from daemon.api.server import ControlServer
from daemon.apps.commands.status import one_line
from daemon.apps.console import access, page_verbs
from daemon.policy.checkpoint import MAX_WALK_ENTRIES, CheckpointError, inspect_checkpoint

# ------------------------------------------------------------------------------- who is the peer


def _pair(family: int = socket.AF_INET, host: str = "127.0.0.1") -> tuple[socket.socket, socket.socket, socket.socket]:
    srv = socket.socket(family)
    srv.bind((host, 0))
    srv.listen()
    client = socket.create_connection(srv.getsockname()[:2])
    conn, _ = srv.accept()
    return srv, client, conn


@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_a_live_connection_names_its_user_and_a_closed_one_nobody(family: int, host: str) -> None:
    try:
        srv, client, conn = _pair(family, host)
    except OSError as exc:
        pytest.skip(f"no {host} here: {exc}")
    with srv, conn:
        peer, local = client.getsockname()[:2], conn.getsockname()[:2]
        assert access.peer_uid(peer, local) == os.geteuid()
        client.close()
        assert conn.recv(16) == b""  # its FIN arrived: the client's end is closed (FIN_WAIT / TIME_WAIT)
        conn.close()
        # the kernel shows uid 0 for such an end; that must not read as "root"
        assert access.peer_uid(peer, local) is None


def test_the_proc_table_fallback_follows_the_same_rule() -> None:
    srv, client, conn = _pair()
    with srv, conn:
        key = access._client_conn(client.getsockname(), conn.getsockname())
        assert access._proc_uid(key) == os.geteuid()
        client.close()
        assert conn.recv(16) == b""
        conn.close()
        assert access._proc_uid(key) is None


def test_a_dual_stack_listener_finds_its_ipv4_client() -> None:
    srv = socket.socket(socket.AF_INET6)
    try:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        srv.bind(("::", 0))
    except OSError as exc:
        pytest.skip(f"no dual-stack socket here: {exc}")
    srv.listen()
    with srv, socket.create_connection(("127.0.0.1", srv.getsockname()[1])):
        conn, peer = srv.accept()
        with conn:
            assert access.peer_uid(peer[:2], conn.getsockname()[:2]) == os.geteuid()


# ------------------------------------------------------------------------------- duplicate keys


def test_a_key_given_twice_is_refused_naming_it() -> None:
    with pytest.raises(JsonRefused, match="'cmd' is given twice"):
        loads_bounded('{"cmd":"hold","cmd":"torque.off"}')
    with pytest.raises(JsonRefused, match="'b' is given twice"):
        loads_bounded('{"cmd":"x","a":[{"b":1,"b":2}]}')
    assert loads_bounded('{"a":{"b":1},"c":{"b":2}}') == {"a": {"b": 1}, "c": {"b": 2}}


def test_the_socket_refuses_a_repeated_cmd_and_runs_neither() -> None:
    ran: list[str] = []
    with tempfile.TemporaryDirectory(prefix="so101d-") as d:
        srv = ControlServer(Path(d) / "control.sock", max_request_bytes=65536)

        def verb(name: str) -> Callable[[dict[str, object]], dict[str, object]]:
            def run(req: dict[str, object]) -> dict[str, object]:
                ran.append(name)
                return {"message": name}

            return run

        srv.register("hold", verb("hold"))
        srv.register("torque.off", verb("torque.off"))
        srv.start()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect(str(srv.path))
                s.sendall(b'{"cmd":"hold","cmd":"torque.off"}\n')
                reply = json.loads(s.makefile("rb").readline())
            with ControlClient(srv.path, timeout_s=5) as c:
                assert c.request("ping")["pong"] is True  # the server answered in order
        finally:
            srv.stop()
    assert reply["ok"] is False and "'cmd' is given twice" in reply["error"], reply
    assert ran == []


# ------------------------------------------------------------------------------- refusal wording


@pytest.mark.parametrize(
    ("obj", "word"),
    [(None, "JSON null"), ([], "an array"), (1, "a number"), ("hold", "text"), (True, "true/false")],
)
def test_a_request_that_is_not_an_object_is_named_in_json_words(obj: object, word: str) -> None:
    with pytest.raises(BadField) as socket_err:
        parse_request(obj)
    with pytest.raises(page_verbs.BadRequest) as page_err:
        page_verbs.parse_request(obj)
    for err in (str(socket_err.value), str(page_err.value)):
        assert err.endswith(f"got {word}"), err
        assert not any(t in err for t in ("NoneType", "list", "int", "str", "bool")), err


def test_page_fields_are_named_in_json_words() -> None:
    for msg in (
        {"id": 1, "cmd": None},
        {"id": 1, "cmd": "policy.load", "args": []},
        {"id": 1, "cmd": "policy.load", "args": {"path": None, "wait_s": "x"}},
        {"id": 1, "cmd": "policy.load", "args": {"path": 5}},
    ):
        with pytest.raises(page_verbs.BadRequest) as err:
            page_verbs.parse_request(msg)
        assert not any(t in str(err.value) for t in ("NoneType", "list", "'x'", "int", "str")), err.value


def test_a_nul_in_a_path_is_a_field_error() -> None:
    with pytest.raises(BadField, match='"path" must not contain a NUL'):
        parse_request({"cmd": "policy.load", "path": "/tmp/a\0b"})


def test_after_seq_has_an_upper_bound() -> None:
    with pytest.raises(BadField, match='"after_seq" must be from 0 to'):
        parse_request({"cmd": "camera.preview", "after_seq": 10**39})
    assert parse_request({"cmd": "camera.preview", "after_seq": 12}).fields["after_seq"] == 12


# ------------------------------------------------------------------------------- Host names


def test_the_host_rule_serves_exactly_the_bind_address() -> None:
    v4 = access.HostRule("127.0.0.1")
    for ok in ("127.0.0.1:8101", "localhost:8101", "localhost", "LOCALHOST."):
        assert v4.permits(ok), ok
    for bad in ("[::1]:8101", "127.0.0.2:8101", "127.1", "localhost:99999", "127.0.0.1:0", "[::1]x"):
        assert not v4.permits(bad), bad
    v6 = access.HostRule("::1")
    assert v6.permits("[::1]:8101") and not v6.permits("127.0.0.1:8101")
    by_name = access.HostRule("localhost")
    assert by_name.permits("127.0.0.1:8101") and by_name.permits("[::1]:8101") and not by_name.permits("127.0.0.2")
    every = access.HostRule("0.0.0.0")
    assert every.permits("10.1.2.3:8101") and not every.permits("evil.example:8101")


# ------------------------------------------------------------------------------- policy.load


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="so101d-ck-") as d:
        yield Path(d)


def _checkpoint(ck: Path, config: str | None = '{"type":"act"}') -> Path:
    ck.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (ck / "config.json").write_text(config)
    (ck / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        (ck / name).write_text('{"steps":[]}')
    return ck


def test_a_link_out_of_the_checkpoint_is_refused_and_not_read(folder: Path) -> None:
    secret = folder / "elsewhere" / "config.json"
    secret.parent.mkdir()
    secret.write_text('{"type":"SECRET-CONTENT"}')
    ck = _checkpoint(folder / "ck", config=None)
    (ck / "config.json").symlink_to(secret)
    with pytest.raises(CheckpointError) as err:
        inspect_checkpoint(ck)
    assert "leads out of the folder" in str(err.value) and "SECRET" not in str(err.value)
    # a dangling link out says the same (no probing whether its target exists)
    (ck / "config.json").unlink()
    (ck / "config.json").symlink_to(folder / "elsewhere" / "nothing.json")
    with pytest.raises(CheckpointError, match="leads out of the folder"):
        inspect_checkpoint(ck)


def test_a_link_inside_the_checkpoint_is_followed(folder: Path) -> None:
    ck = _checkpoint(folder / "ck", config=None)
    (ck / "real").mkdir()
    (ck / "real" / "config.json").write_text('{"type":"SECRET-CONTENT"}')
    (ck / "config.json").symlink_to(ck / "real" / "config.json")
    with pytest.raises(CheckpointError) as err:
        inspect_checkpoint(ck)
    msg = str(err.value)
    assert "names a policy type this daemon does not run" in msg and "SECRET" not in msg, msg


def test_a_processor_state_file_is_not_quoted(folder: Path) -> None:
    ck = _checkpoint(folder / "ck")
    (ck / "policy_preprocessor.json").write_text('{"steps":[{"state_file":"../SECRET.safetensors"}]}')
    with pytest.raises(CheckpointError) as err:
        inspect_checkpoint(ck)
    assert "points outside" in str(err.value) and "SECRET" not in str(err.value)


def test_a_fifo_is_not_a_checkpoint_and_is_never_opened(folder: Path) -> None:
    os.mkfifo(folder / "fifo")
    with pytest.raises(CheckpointError, match="is not a checkpoint: not a folder"):
        inspect_checkpoint(folder / "fifo")
    ck = _checkpoint(folder / "ck", config=None)
    os.mkfifo(ck / "config.json")  # opening it for reading would wait for a writer forever
    with pytest.raises(CheckpointError, match="config.json is not a regular file"):
        inspect_checkpoint(ck)
    with pytest.raises(CheckpointError, match="is not a checkpoint: not a folder"):
        inspect_checkpoint("/dev/zero")


def test_the_walk_is_bounded_in_folders_too(folder: Path) -> None:
    ck = _checkpoint(folder / "wide")
    for i in range(MAX_WALK_ENTRIES + 1):
        (ck / f"d{i}").mkdir()
    with pytest.raises(CheckpointError, match=f"more than {MAX_WALK_ENTRIES} entries"):
        inspect_checkpoint(ck)


def test_the_walk_is_bounded_in_depth(folder: Path) -> None:
    ck = _checkpoint(folder / "deep")
    (ck / "a" / "b" / "c" / "d" / "e" / "f" / "g").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="levels to look through"):
        inspect_checkpoint(ck)


# ------------------------------------------------------------------------------- so101d status


def test_status_shows_control_socket_restarts() -> None:
    st = {
        "mode": "hold",
        "control_socket": {"serving": True, "thread_restarts": 2, "last_thread_failure": "OSError: boom"},
    }
    line = one_line(st)
    assert "control socket: serving thread restarted 2x (last failure: OSError: boom)" in line, line
    quiet = one_line({"mode": "hold", "control_socket": {"serving": True, "thread_restarts": 0}})
    assert "control socket" not in quiet
