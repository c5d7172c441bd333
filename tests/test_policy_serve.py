"""The ZeroMQ policy endpoint for other local clients: msgpack + raw arrays, versioned, limits,
errors are replies (the server keeps serving)."""

from __future__ import annotations

import threading
from pathlib import Path

import msgpack
import numpy as np
import pytest
from policy_support import tiny_act

from daemon.policy.checkpoint import ExpectedIO
from daemon.policy.engine import PolicyEngine
from daemon.policy.serve import PolicyClient, PolicyServer, PolicyServerError, check_endpoint
from daemon.policy.tiny import synthetic_frame, synthetic_pose

H, W = 48, 64


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> PolicyEngine:
    ckpt = tiny_act(tmp_path_factory, {"front": (H, W)})
    return PolicyEngine.from_checkpoint(str(ckpt), ExpectedIO(cameras={"front": (H, W)}))


@pytest.fixture()
def server(engine, tmp_path: Path):
    endpoint = f"ipc://{tmp_path}/policy.ipc"
    srv = PolicyServer(engine, endpoint).bind()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_ms": 20}, daemon=True)
    t.start()
    yield srv
    srv.stop()
    t.join(5)
    assert not t.is_alive()
    assert not Path(endpoint[len("ipc://") :]).exists()


def test_endpoint_must_be_local() -> None:
    assert check_endpoint("tcp://127.0.0.1:5999")
    assert check_endpoint("ipc:///tmp/x.ipc")
    for bad in ("tcp://0.0.0.0:5999", "tcp://*:5999", "tcp://10.0.0.2:1", "ws://127.0.0.1:1", "ipc://"):
        with pytest.raises(ValueError, match="loopback"):
            check_endpoint(bad)


def test_infer_round_trip_matches_in_process(engine, server) -> None:
    state = synthetic_pose(0.3)
    img = synthetic_frame(state, H, W)
    expected, _ = engine.infer(state, {"front": img})
    with PolicyClient(server.endpoint, timeout_s=20) as client:
        assert client.ping()
        info = client.info()
        assert info["policy_type"] == "act" and info["cameras"] == {"front": [H, W]}
        actions, timings = client.infer(state, {"front": img})
        np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-4)
        assert actions.shape == (10, 6) and timings["forward"] > 0
        client.reset()


def test_bad_requests_get_error_replies_and_the_server_keeps_serving(server) -> None:
    state = synthetic_pose(0.1)
    with PolicyClient(server.endpoint, timeout_s=20) as client:
        cases = [
            ([b"\xc1not msgpack"], "not msgpack"),
            ([msgpack.packb({"v": 99, "cmd": "ping"})], "protocol version 99"),
            ([msgpack.packb({"v": 1, "cmd": "fly"})], "unknown cmd"),
            ([msgpack.packb({"v": 1, "cmd": "infer"})], "needs 'observation.state'"),
            (
                [
                    msgpack.packb(
                        {
                            "v": 1,
                            "cmd": "infer",
                            "arrays": [{"name": "observation.state", "dtype": "float32", "shape": [6]}],
                        }
                    ),
                    b"\x00" * 7,
                ],
                "7 bytes",
            ),
            (
                [
                    msgpack.packb({"v": 1, "cmd": "infer", "arrays": [{"name": "x", "dtype": "object", "shape": [1]}]}),
                    b"\x00",
                ],
                "dtype",
            ),
            ([msgpack.packb({"v": 1, "cmd": "infer", "arrays": []}), b"extra"], "0 arrays but 1 data frames"),
            ([msgpack.packb({"v": 1, "cmd": "ping", "pad": "x" * 70000})], "header larger"),
        ]
        for frames, needle in cases:
            reply = client.send_raw(frames)
            assert reply["ok"] is False and needle in reply["error"], (needle, reply)
        with pytest.raises(PolicyServerError, match="camera 'front' missing"):
            client.infer(state, {})
        with pytest.raises(PolicyServerError, match="camera 'front'"):
            client.infer(state, {"front": np.zeros((H + 1, W, 3), np.uint8)})
        with pytest.raises(PolicyServerError, match="NaN"):
            client.infer(np.full(6, np.nan), {"front": np.zeros((H, W, 3), np.uint8)})
        # still alive and correct
        actions, _ = client.infer(state, {"front": synthetic_frame(state, H, W)})
        assert actions.shape == (10, 6)
    assert server.errors >= len(cases) + 3
