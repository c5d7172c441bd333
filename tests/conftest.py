"""Suite-wide pytest setup: every test file's kind, the shared virtual bench, the e2e timing table,
the check that a run leaves the working tree as it found it, and the end of the test process.

Kinds (markers ``unit``, ``integration``, ``e2e``; each test has exactly one):

- ``unit``: one module in this process, plain data or a fake clock; no pseudo-terminal, no child
  process, no daemon. `make test-unit` runs only these (``-m unit``), in seconds, while you work.
- ``integration``: several of our parts together in this process (the loop and our driver on the
  emulator's ptys, the socket server, the recorder and its writer process, LeRobot's libraries).
- ``e2e``: through our programs as a user runs them (``so101d run``/``demo``/``emulate``, the CLI
  verbs, the console in a browser) or through LeRobot's own programs.

A file's kind comes from ``FILE_KINDS`` below; a ``pytestmark`` or a test's own marker of one of
the kinds wins (a long e2e test in an integration file). A new test file must be given a kind:
collection stops naming it.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from virtual_bench_support import VirtualBench, open_virtual_bench

# Fakes of hardware SDKs LeRobot imports (tests/fixtures/sdk: pyrealsense2, with its dist-info),
# first on the path for the whole run: LeRobot decides once, when lerobot.utils.import_utils is
# first imported (by whichever test file comes first), whether an SDK is installed. With no device
# plugged into the fake (the default) it is the SDK on a machine without that camera.
FAKE_SDKS = Path(__file__).resolve().parent / "fixtures" / "sdk"
sys.path.insert(0, str(FAKE_SDKS))

KINDS = ("unit", "integration", "e2e")

FILE_KINDS: dict[str, str] = {
    # plain data, one module
    "test_calibration_file.py": "unit",
    "test_calibration_bimanual.py": "e2e",
    "test_conventions.py": "unit",
    "test_daemon_config.py": "unit",
    "test_daemon_faults.py": "unit",
    "test_daemon_logs.py": "unit",
    "test_daemon_safety.py": "unit",
    "test_bounded_json.py": "unit",
    "test_daemon_stats.py": "unit",
    "test_emulator_dynamics.py": "unit",
    "test_emulator_protocol.py": "unit",
    "test_packaging.py": "unit",
    "test_policy_path_check.py": "unit",
    "test_policy_arm_split.py": "unit",
    "test_policy_queue.py": "unit",
    "test_readme.py": "unit",
    "test_service_find_ports.py": "unit",
    "test_service_reload.py": "unit",
    "test_service_sd_notify.py": "unit",
    "test_signal_wake.py": "unit",
    "test_sim_protocol.py": "unit",
    "test_sim_remote_leader.py": "unit",
    # our parts together, in this process (ptys, sockets, the writer process, LeRobot's libraries)
    "test_calibration_procedure.py": "integration",
    "test_calibration_restore.py": "integration",
    "test_code_shape.py": "integration",  # ruff, mypy and the import check over the whole tree
    "test_control_path_followups.py": "integration",
    "test_daemon_loop.py": "integration",
    "test_arms_and_sources.py": "integration",
    "test_client_arm.py": "integration",
    "test_frame_shm.py": "unit",
    "test_lerobot_plugin.py": "e2e",
    "test_bimanual_clients.py": "e2e",
    "test_attack_bimanual_2.py": "e2e",
    "test_lerobot_robot_client.py": "e2e",
    "test_lerobot_rollout.py": "e2e",
    "test_reconnect_honesty.py": "integration",
    "test_source_misbehaviour.py": "integration",
    "test_reconnect_port.py": "integration",
    "test_api_refusal_fields.py": "integration",
    "test_suite_setup.py": "integration",
    "test_merge_older_dataset.py": "unit",
    "test_daemon_seams.py": "integration",
    "test_daemon_socket.py": "integration",
    "test_daemon_socket_lockout.py": "integration",
    "test_daemon_socket_poison.py": "integration",
    "test_daemon_status.py": "integration",
    "test_daemon_strict_servos.py": "integration",
    "test_dataset_check.py": "integration",
    "test_dataset_edit.py": "integration",
    "test_dataset_tags.py": "integration",
    "test_driver_arm.py": "integration",
    "test_driver_bus.py": "integration",
    "test_driver_strict_servos.py": "integration",
    "test_emulator_faults.py": "integration",
    "test_emulator_realism.py": "integration",
    "test_emulator_sdk.py": "integration",
    "test_noisy_bus.py": "integration",
    "test_output_chatter.py": "integration",
    "test_policy_act.py": "integration",
    "test_policy_daemon.py": "integration",
    "test_policy_fused_io.py": "integration",
    "test_policy_heap.py": "integration",
    "test_policy_keepup.py": "integration",
    "test_policy_latency.py": "integration",
    "test_policy_obs_buffer.py": "integration",
    "test_policy_serve.py": "integration",
    "test_policy_sim.py": "integration",
    "test_policy_takeover.py": "integration",
    "test_realtime_encoders.py": "integration",
    "test_recording_cameras.py": "integration",
    "test_recording_dataset.py": "integration",
    "test_recording_faults.py": "integration",
    "test_recording_ring_memory.py": "integration",
    "test_recording_scale.py": "integration",
    "test_recording_tags.py": "integration",
    "test_recording_continuous.py": "integration",
    "test_recording_preroll.py": "unit",
    "test_recording_keep.py": "integration",
    "test_replay.py": "e2e",
    "test_replay_attacks.py": "e2e",
    "test_replay_source.py": "unit",
    "test_replay_inputs.py": "unit",
    "test_dataset_feasibility.py": "integration",
    "test_review_loop.py": "integration",
    "test_service_install.py": "integration",
    "test_service_unit.py": "integration",
    "test_sim_daemon.py": "integration",
    "test_sim_bimanual.py": "integration",
    "test_sim_leisaac.py": "integration",
    "test_sim_mujoco.py": "integration",
    "test_sim_recording.py": "integration",
    "test_pedal.py": "integration",
    # our programs as a user runs them, or LeRobot's
    "test_api_schema.py": "e2e",
    "test_console_access.py": "e2e",
    "test_console_attacks.py": "e2e",
    "test_console_browser.py": "e2e",
    "test_console_bimanual.py": "e2e",
    "test_daemon_hold_paths.py": "e2e",
    "test_daemon_process.py": "e2e",
    "test_dataset_benches.py": "e2e",
    "test_demo_output.py": "e2e",
    "test_doctor.py": "e2e",
    "test_emulator_cli.py": "e2e",
    "test_emulator_lerobot.py": "e2e",
    "test_emulator_parent.py": "e2e",
    "test_first_run_story.py": "e2e",
    "test_hdf5_bridge.py": "e2e",
    "test_hdf5_bimanual.py": "e2e",
    "test_new_kit_or_cut_chain.py": "e2e",
    "test_policy_cli.py": "e2e",
    "test_policy_server.py": "e2e",
    "test_readme_walkthrough.py": "e2e",
    "test_recording_crash.py": "e2e",
    "test_recording_daemon.py": "e2e",
    "test_recording_demo.py": "e2e",
    "test_recording_health.py": "e2e",
    "test_recording_power_cut.py": "e2e",
    "test_recording_service.py": "e2e",
    "test_recording_sim_episodes.py": "e2e",
    "test_recording_train.py": "e2e",
    "test_rerun_stream.py": "e2e",
    "test_service_daemon.py": "e2e",
    "test_service_signals.py": "e2e",
    "test_setup_motors.py": "e2e",
    "test_sim_gl_backend.py": "e2e",
    "test_status_output.py": "e2e",
    "test_cameras_find.py": "e2e",
    "test_cameras_doctor.py": "integration",
    "test_cameras_lerobot.py": "integration",
    "test_cameras_recording.py": "e2e",
    "test_cameras_realsense.py": "integration",
    "test_cameras_depth_recording.py": "e2e",
    "test_attack_cameras.py": "integration",
}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m unit`` alone (`make test-unit`), the other kinds' files are not even imported:
    importing them (torch, LeRobot, MuJoCo) takes longer than running every unit test."""
    if config.option.markexpr == "unit" and FILE_KINDS.get(collection_path.name, "unit") != "unit":
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unclassified: set[str] = set()
    for item in items:
        own = [m.name for m in item.iter_markers() if m.name in KINDS]
        if own:
            # a test's own marker is found first (closest), then its module's pytestmark
            if len(set(own)) > 1:
                item.own_markers[:] = [m for m in item.own_markers if m.name not in KINDS or m.name == own[0]]
            continue
        name = item.path.name
        kind = FILE_KINDS.get(name)
        if kind is None:
            unclassified.add(name)
            continue
        item.add_marker(kind)
    if unclassified:
        raise pytest.UsageError(
            f"tests without a kind: {sorted(unclassified)}; add each file to FILE_KINDS in tests/conftest.py "
            f"(one of {', '.join(KINDS)}) or give it a pytestmark"
        )


@pytest.fixture
def virtual_bench() -> Iterator[VirtualBench]:
    """An emulated leader and follower on ptys in this process, calibrated, held still
    (tests/virtual_bench_support.py)."""
    with open_virtual_bench() as bench:
        yield bench


# -- Ctrl-C stories, whoever started the run ------------------------------------------------------
# A shell starts a background job (`make test &`, a CI step run with `&`) with SIGINT ignored, and
# an ignored signal is inherited across exec: every `so101d` the tests start would then ignore the
# Ctrl-C its story sends (a replay ran to its end, a calibration saw "stdin closed" instead).
# Python's own handler here makes the children start with the default, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# -- no process outlives its test file ---------------------------------------------------------------
# A story that fails half-way can leave its daemon, demo or emulator running; on a 2-core machine
# such a leftover loads every later test (one ran for 28 minutes of a suite run). Each file's
# processes carry a token in their environment (inherited by whatever they spawn with the
# environment passed on); when the file is done, any still alive after a short grace are killed
# and the file fails, naming them.
_TOKEN_VAR = "SO101D_TEST_FILE_TOKEN"
_LEFTOVER_GRACE_S = 10.0


def _processes_with(token: str) -> dict[int, str]:
    found = {}
    needle = f"{_TOKEN_VAR}={token}".encode()
    for env_path in Path("/proc").glob("[0-9]*/environ"):
        pid = int(env_path.parent.name)
        if pid == os.getpid():
            continue
        try:
            if needle not in env_path.read_bytes().split(b"\0"):
                continue
            cmd = (env_path.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if not cmd:  # a zombie has none: it is only waiting for its parent
            continue
        if "multiprocessing.resource_tracker" in cmd and _parent(pid) == os.getpid():
            continue  # this test process's own tracker (multiprocessing starts one, for its lifetime)
        found[pid] = cmd.strip()
    return found


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.fixture(scope="module", autouse=True)
def _no_process_outlives_its_file() -> Iterator[None]:
    token = uuid.uuid4().hex
    os.environ[_TOKEN_VAR] = token
    try:
        yield
    finally:
        os.environ.pop(_TOKEN_VAR, None)
    deadline = time.monotonic() + _LEFTOVER_GRACE_S
    left = _processes_with(token)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)  # a daemon told to stop, a resource tracker: they finish on their own
        left = _processes_with(token)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        pytest.fail(
            "processes started by this file were still running after it ended (now killed): "
            + "; ".join(f"{pid}: {cmd[:160]}" for pid, cmd in sorted(left.items())),
            pytrace=False,
        )


# -- the e2e tests, timed in every run -------------------------------------------------------------
# `make test` ends with the slowest e2e tests (setup + call + teardown, so a module fixture that
# starts a daemon counts where it runs) and the total of all, so a test that got slower shows up in
# the output of the command everybody runs, not only when someone asks for ``--durations``.
_E2E_SECONDS: dict[str, float] = defaultdict(float)
_E2E_OUTCOME: dict[str, str] = {}
_E2E_SHOWN = 30  # a third of the suite is e2e: its slowest tests, not a page of lines per run


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _count_file_cost(report)
    if "e2e" not in report.keywords:
        return
    _E2E_SECONDS[report.nodeid] += report.duration
    if report.failed or report.nodeid not in _E2E_OUTCOME:
        _E2E_OUTCOME[report.nodeid] = report.outcome


# -- every file's cost, wall and CPU --------------------------------------------------------------
# Where `make test`'s time goes, per test file: wall seconds (setup + call + teardown) and the CPU
# seconds this test process and the children it waited for spent meanwhile. CPU over wall says
# whether a file waits (a candidate for a parallel worker) or computes (cheapen it instead); the
# suite's CPU over the machine's cores is the floor no worker count goes below.
_FILE_WALL_S: dict[str, float] = defaultdict(float)
_FILE_CPU_S: dict[str, float] = defaultdict(float)
_FILES_SHOWN = 25
_PHASE_CPU_START = pytest.StashKey[float]()


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    item.stash[_PHASE_CPU_START] = _cpu_s()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    item.stash[_PHASE_CPU_START] = _cpu_s()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    item.stash[_PHASE_CPU_START] = _cpu_s()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    start = item.stash.get(_PHASE_CPU_START, None)
    if start is not None:
        report.user_properties.append(("cpu_s", _cpu_s() - start))  # travels to xdist's controller
    return report


def _count_file_cost(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_WALL_S[path] += report.duration
    _FILE_CPU_S[path] += sum(float(v) for k, v in report.user_properties if k == "cpu_s")


def _write_file_costs(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FILE_WALL_S:
        return
    wall_s, cpu_s = sum(_FILE_WALL_S.values()), sum(_FILE_CPU_S.values())
    shown = sorted(_FILE_WALL_S, key=lambda f: -_FILE_WALL_S[f])[:_FILES_SHOWN]
    terminalreporter.section(
        f"test files: {len(_FILE_WALL_S)}, {wall_s:.0f} s wall and {cpu_s:.0f} s CPU in all; the {len(shown)} costliest"
    )
    for path in shown:
        wall, cpu = _FILE_WALL_S[path], _FILE_CPU_S[path]
        terminalreporter.write_line(f"{wall:8.1f} s wall {cpu:8.1f} s CPU  {cpu / max(wall, 1e-9):4.2f}  {path}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    _write_file_costs(terminalreporter)
    if _TREE_CHANGES:
        terminalreporter.section("the tests changed the working tree: the run fails", red=True)
        for line in _TREE_CHANGES:
            terminalreporter.write_line(line)
    if not _E2E_SECONDS:
        return
    total_s = sum(_E2E_SECONDS.values())
    shown = sorted(_E2E_SECONDS.items(), key=lambda kv: -kv[1])[:_E2E_SHOWN]
    terminalreporter.section(f"e2e tests: {len(_E2E_SECONDS)}, {total_s:.1f} s in all; the {len(shown)} slowest")
    for nodeid, seconds in shown:
        terminalreporter.write_line(f"{seconds:8.2f} s  {_E2E_OUTCOME.get(nodeid, '?'):7s}  {nodeid}")


# -- the working tree, before and after ------------------------------------------------------------
# A test that writes into the checkout (LeRobot's policy server logs into ./logs of its working
# directory, for one) leaves files someone commits by accident. `git status` before the session
# and after it: anything new fails the run, naming the paths. Only the process that runs the
# session checks (not each xdist worker), and only in a git checkout.
_REPO = Path(__file__).resolve().parent.parent
_TREE_BEFORE: list[set[str]] = []
_TREE_CHANGES: list[str] = []


def _tree_status() -> set[str] | None:
    try:
        r = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=_REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(r.stdout.splitlines()) if r.returncode == 0 else None


def _is_xdist_worker(config: pytest.Config) -> bool:
    return "workerinput" in config.__dict__


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _is_xdist_worker(session.config):
        before = _tree_status()
        if before is not None:
            _TREE_BEFORE.append(before)


# -- the end of the test process -------------------------------------------------------------------
# One CI run (716 passed, 4 skipped) ended in "terminate called without an active exception" and
# SIGABRT after the summary was printed: a C++ static destructor of a library loaded in this process
# (torch, pyarrow and grpc all are) met a thread still running during interpreter teardown, a known
# way for a torch test suite to fail with every test passed. The verdict is pytest's; the test
# process ends with it, without that teardown. The exits that matter (the daemon's, the writer's,
# the policy worker's) happen in processes of their own and are tested there.
# SO101D_TESTS_FULL_TEARDOWN=1 keeps the interpreter's teardown, to look for the culprit.
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _TREE_BEFORE:
        after = _tree_status()
        if after is not None:
            _TREE_CHANGES.extend(sorted(after - _TREE_BEFORE[0]))
            if _TREE_CHANGES and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _EXIT_STATUS.append(int(session.exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # Only a run whose tests ran ends here: pytest prints a usage or internal error (a file with no
    # kind, for one) after this hook, and os._exit would swallow the message.
    ran = _EXIT_STATUS and _EXIT_STATUS[-1] in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    if ran and not _is_xdist_worker(config) and not os.environ.get("SO101D_TESTS_FULL_TEARDOWN"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
