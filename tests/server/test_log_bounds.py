"""Log lines are bounded whatever a client sends (server/logs.py): a 5 MB model name, path, header,
tool name or error message that quotes the request gives a line of a few KB, its cuts marked."""

from __future__ import annotations

import logging

import httpx
import orjson
import pytest

from deepseek_frontend.server.logs import (
    MAX_LOG_FIELD_CHARS,
    MAX_LOG_MESSAGE_CHARS,
    MAX_LOG_TRACEBACK_CHARS,
    JsonFormatter,
    KeyValueFormatter,
)
from tests.support.servers import start_frontend
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

HUGE = "m" * 5_000_000
#: the longest line a record may give: message, a dozen fields, a traceback, with their cut marks
LONGEST_LINE = MAX_LOG_MESSAGE_CHARS + 16 * (MAX_LOG_FIELD_CHARS + 64) + MAX_LOG_TRACEBACK_CHARS + 512


def _record(exc: bool = False) -> logging.LogRecord:
    try:
        raise ValueError(HUGE)
    except ValueError as e:
        info = (type(e), e, e.__traceback__) if exc else None
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "failed: %s", (HUGE,), info)
    record.__dict__.update({"model": HUGE, "status": 400, "error": HUGE})
    return record


@pytest.mark.parametrize("formatter", [KeyValueFormatter(), JsonFormatter()])
def test_every_part_of_a_record_is_cut_at_its_bound(formatter: logging.Formatter) -> None:
    line = formatter.format(_record(exc=True))
    assert len(line) < LONGEST_LINE, len(line)
    assert "more characters]" in line
    if isinstance(formatter, JsonFormatter):
        out = orjson.loads(line)
        assert out["status"] == 400  # numbers stay numbers
        assert len(out["model"]) < MAX_LOG_FIELD_CHARS + 64


def test_a_5_mb_model_name_gives_a_short_log_line() -> None:
    """The report: a 5 MB model name became a 5 MB "request done" line."""
    with start_frontend("--max-body-bytes", str(16 * 1024 * 1024)) as server:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            r = http.post(
                "/v1/chat/completions",
                json={"model": HUGE, "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-request-id": "huge-model"},
            )
            assert r.status_code == 404, r.text[:300]
            r = http.get("/v1/" + "p" * 60_000, headers={"user-agent": HUGE[:60_000]})
            assert r.status_code in (404, 414, 431), r.status_code
        wait_until(lambda: "endpoint=/v1/chat/completions" in server.log(), "the request done line")
        log = server.log()
    lines = log.splitlines()
    assert lines and max(len(line) for line in lines) < LONGEST_LINE, max(len(line) for line in lines)
    assert len(log) < 200_000, len(log)
