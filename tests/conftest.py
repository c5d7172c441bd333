"""Suite-wide pytest hooks: the long end-to-end tests (marker ``e2e``) are timed in every run.

`make test` ends with one line per e2e test (setup + call + teardown, so a module fixture that
starts a daemon counts where it runs) and their total, so a test that got slower shows up in the
output of the command everybody runs, not only when someone asks for ``--durations``.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict

import pytest

_E2E_SECONDS: dict[str, float] = defaultdict(float)
_E2E_OUTCOME: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "e2e" not in report.keywords:
        return
    _E2E_SECONDS[report.nodeid] += report.duration
    if report.failed or report.nodeid not in _E2E_OUTCOME:
        _E2E_OUTCOME[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _E2E_SECONDS:
        return
    total_s = sum(_E2E_SECONDS.values())
    terminalreporter.section(f"e2e tests: {len(_E2E_SECONDS)}, {total_s:.1f} s in all")
    for nodeid, seconds in sorted(_E2E_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"{seconds:8.2f} s  {_E2E_OUTCOME.get(nodeid, '?'):7s}  {nodeid}")


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
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if _EXIT_STATUS and not os.environ.get("SO101D_TESTS_FULL_TEARDOWN"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
