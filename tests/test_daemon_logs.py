"""setup_logging: stderr looked up when a record is emitted, no duplicate handlers."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from daemon.system.logs import CurrentStderrHandler, setup_logging


@pytest.fixture
def clean_root():
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = saved
    root.setLevel(level)


def test_logging_after_stderr_was_swapped_and_closed(clean_root, monkeypatch: pytest.MonkeyPatch) -> None:
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging("INFO")
    logging.getLogger("so101d.test").info("one")
    assert "INFO so101d.test: one" in first.getvalue()
    first.close()  # what pytest does to its capture file after a test that ran main() in-process
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("so101d.test").warning("two")
    out = second.getvalue()
    assert "WARNING so101d.test: two" in out and "Logging error" not in out


def test_setup_twice_keeps_one_handler_and_foreign_handlers(clean_root, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    foreign = logging.NullHandler()
    clean_root.handlers[:] = [logging.StreamHandler(buf), foreign]  # as after logging.basicConfig + a capture
    setup_logging("DEBUG")
    setup_logging("bogus")  # unknown level: INFO, with a warning
    ours = [h for h in clean_root.handlers if isinstance(h, CurrentStderrHandler)]
    assert len(ours) == 1 and foreign in clean_root.handlers
    assert not any(type(h) is logging.StreamHandler for h in clean_root.handlers)
    assert clean_root.level == logging.INFO
    logging.getLogger("so101d.test").info("once")
    assert buf.getvalue().count("so101d.test: once") == 1
    assert "unknown log level 'bogus'" in buf.getvalue()
