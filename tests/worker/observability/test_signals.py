"""The worker's logging (worker/observability/signals.py): ours in place of Celery's, without Celery's
"received" line per task at INFO (the processor's "message finished" line says more), with it
at DEBUG; Celery's "succeeded" line (with the request id) stays."""

from __future__ import annotations

import logging

import pytest

from tests.support.env import make_env, settings_from
from worker.observability import signals


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)
    for name in signals.PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)


@pytest.mark.parametrize(("level", "per_task_lines"), [("INFO", False), ("DEBUG", True)])
def test_celerys_line_per_task_only_at_debug(monkeypatch, restore_logging, level, per_task_lines):
    settings = settings_from(make_env(LOG_LEVEL=level))
    monkeypatch.setattr("app.config.get_settings", lambda: settings)
    signals._configure_logging()
    for name in signals.PER_TASK_LOGGERS:
        assert logging.getLogger(name).isEnabledFor(logging.INFO) is per_task_lines
    assert logging.getLogger("worker.processor").isEnabledFor(logging.INFO)
    assert logging.getLogger("celery.app.trace").isEnabledFor(logging.INFO)
