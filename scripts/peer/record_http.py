"""pytest plugin: the HTTP exchanges of each failing peer test, into the JUnit report.

Loaded by scripts/peer-suites.sh with ``-p record_http``. It only observes: while a test's
call phase runs it records what the clients log about their requests and answers --

  deepl-python   logger ``deepl`` ("Request to DeepL API method=... url=...", "Request
                 details data=... json=...", "DeepL API response status_code=...", "Response
                 details content=...")
  libretranslate logger ``peer.http`` (scripts/peer/lt_conftest.py's HTTP client)

-- and when the test fails it adds them to the test's JUnit entry as the property
``peer_http``, which scripts/peer/summarize.py prints under each protocol failure.

deepl's CLI (tests/test_cli.py) sets the ``deepl`` logger's level and adds stream handlers
itself, and those tests print the request details in their own failure messages (-vv), so the
``deepl`` logger is left alone for them; for every other test its level and handlers are set for
the call and put back as they were afterwards.
"""

from __future__ import annotations

import logging

import pytest

LOGGERS = ("deepl", "peer.http")
MAX_LINES = 40
MAX_LINE_CHARS = 600


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = f"{record.name}: {record.getMessage()}"
        except Exception:  # a record that cannot be formatted is not worth a failure
            return
        if len(self.lines) < MAX_LINES:
            self.lines.append(line[:MAX_LINE_CHARS])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    recorder = _Recorder()
    saved = []
    for name in LOGGERS:
        if name == "deepl" and item.nodeid.startswith("tests/test_cli.py"):
            continue
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, list(logger.handlers)))
        logger.setLevel(logging.DEBUG)
        logger.handlers = [recorder]
    item._peer_http = recorder  # read by pytest_runtest_makereport below
    try:
        yield
    finally:
        for logger, level, handlers in saved:
            logger.setLevel(level)
            logger.handlers = handlers


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    recorder = getattr(item, "_peer_http", None)
    if call.when == "call" and call.excinfo is not None and recorder is not None and recorder.lines:
        # Before the report is made: it copies item.user_properties.
        item.user_properties.append(("peer_http", "\n".join(recorder.lines)))
    yield
