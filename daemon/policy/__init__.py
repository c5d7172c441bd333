"""LeRobot policies served next to the servos, locally or through LeRobot's policy server.

checkpoint.py  safe offline loading (safetensors only) + input/output checks against the config
engine.py      one observation -> one action chunk (the only torch code on the hot path)
worker.py      the policy process (spawned); obs_buffer.py the shared-memory observation (seqlock)
action_queue.py time-stamped chunks: stale dropping, latest (cross-faded) / temporal-ensembling merge,
               usable horizon (what the refill rule compares with the measured latency)
runner.py      PolicySource: the control loop's microsecond-cost ``target(now, state)``
arm_split.py   one policy over a bimanual rig's arms: one observation of both, each arm its half
takeover.py    policy -> teleop without a jump (leader moved to the follower, then released)
serve.py       ZeroMQ endpoint + PolicyClient for other local programs
lerobot_server.py backend "lerobot-server": the worker speaks LeRobot's async-inference gRPC to its
               policy server (GPU host); safe_unpickle.py the only way its replies are decoded
tiny.py        small real checkpoints built offline (tests, benchmarks)

The socket verbs and episode wiring live in daemon/service/attach_policy.py.

May import: calibration, drivers, daemon.system, daemon.config, daemon.control, daemon.data.
"""
