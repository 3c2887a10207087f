"""API keys with names, allowed models and limits, end to end over HTTP on real ``serve`` processes.

Three servers on the built-in simulated engine (``--sim-itl-ms`` makes a stream last as long as
its ``max_tokens``, ``ignore_eos`` makes it use them all):

* ``limits_server`` -- ``--config`` with two models and one key per behaviour: concurrency,
  requests and tokens per minute, a key restricted to one model, an unlimited key, one key per
  protocol whose headers are checked and one for background responses;
* a ``--keys-file`` server logging JSON at debug level, whose key is given as ``key_sha256``;
* a ``--workers 2`` server whose processes share the keys' limits.

Each test uses keys of its own, so the buckets of one test never feed another's. The keys are
random, so a key found in a server's log output can only have come from a request or the config.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deepseek_frontend.edge.reservation import estimate_prompt_tokens
from tests.support.servers import Server, start_frontend
from tests.support.waiting import wait_until

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
#: milliseconds between streamed tokens: a request with ``max_tokens`` N lasts about N * ITL_MS
ITL_MS = 25
#: output tokens of a slow stream (about 2 s at ITL_MS): far longer than it takes to send 20 requests
SLOW_TOKENS = 80
#: seconds any single request may take before the test fails
REQUEST_TIMEOUT_S = 30.0

KEYS = {
    name: "sk-" + secrets.token_hex(20)
    for name in (
        "concurrent",
        "abandoning",
        "unlimited",
        "per-minute",
        "tokens",
        "token-burst",
        "restricted",
        "anthropic-client",
        "openai-client",
        "responses-client",
        "background",
        "hashed",
        "plain",
        "shared-per-minute",
        "shared-concurrent",
    )
}
#: a key no server knows
WRONG_KEY = "sk-" + secrets.token_hex(20)
#: ~450 prompt tokens, the same every time: from the second request on, its whole pages (256 tokens,
#: SGLang's DeepSeek-V4 page size) come from the simulated prefix cache
CACHEABLE_PROMPT = " ".join(
    f"Count the tokens of sentence {n} about token buckets, in-flight counts and the headers "
    "that tell a client how long to wait before it tries again."
    for n in range(15)
)
#: the "tokens" key's limit: a few requests of CACHEABLE_PROMPT fit in it, not ten
TOKENS_PER_MINUTE = 2_000


@dataclass
class Outcome:
    """One request as the client saw it (``time.monotonic`` stamps)."""

    status: int
    sent: float
    answered: float
    ended: float
    headers: httpx.Headers
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


def post(url: str, path: str, key: str, body: dict, *, anthropic_style: bool = False) -> Outcome:
    """POST ``body`` on a new connection (closed after it) and read the whole answer."""
    headers = {"connection": "close"}
    if anthropic_style:
        headers |= {"x-api-key": key, "anthropic-version": "2023-06-01"}
    else:
        headers["authorization"] = f"Bearer {key}"
    sent = time.monotonic()
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=REQUEST_TIMEOUT_S) as r:
        answered = time.monotonic()
        data = r.read()
    return Outcome(r.status_code, sent, answered, time.monotonic(), r.headers, data)


def chat_body(
    model: str = "m1", max_tokens: int = 4, *, stream: bool = False, content: str = "hello"
) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


def messages_body(model: str = "m1", max_tokens: int = 4, *, stream: bool = False) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def send_together(count: int, send: Callable[[int], Outcome]) -> list[Outcome]:
    """Call ``send(i)`` for ``i`` in ``range(count)`` from ``count`` threads released at once."""
    barrier = threading.Barrier(count)

    def one(i: int) -> Outcome:
        barrier.wait(timeout=REQUEST_TIMEOUT_S)
        return send(i)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def most_at_once(outcomes: list[Outcome]) -> int:
    """The most of ``outcomes`` whose answers were streaming at one moment (answered .. ended)."""
    events = sorted([(o.answered, 1) for o in outcomes] + [(o.ended, -1) for o in outcomes])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def per_process(url: str, name: str, **labels: str) -> dict[str, float]:
    """``name``'s samples whose labels include ``labels``, summed by their ``process`` label."""
    text = httpx.get(url + "/metrics", timeout=REQUEST_TIMEOUT_S).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                process = sample.labels.get("process", "")
                totals[process] = totals.get(process, 0.0) + sample.value
    return totals


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples in ``/metrics`` whose labels include ``labels`` (every process)."""
    return sum(per_process(url, name, **labels).values())


def reported_usage(outcome: Outcome) -> dict:
    """The ``usage`` a chat completion reported: in its body, or in the last chunk of its stream."""
    if not outcome.headers["content-type"].startswith("text/event-stream"):
        return outcome.json()["usage"]
    chunks = [
        json.loads(line[len("data: ") :])
        for line in outcome.body.decode().splitlines()
        if line.startswith("data: {")
    ]
    usages = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert len(usages) == 1, chunks[-2:]
    return usages[0]


def assert_rate_limited_openai(outcome: Outcome) -> None:
    assert outcome.status == 429, outcome.body
    error = outcome.json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert error["type"] == "rate_limit_error"
    assert int(outcome.headers["retry-after"]) >= 1


def assert_no_key_in(text: str) -> None:
    for name, key in KEYS.items():
        assert key not in text, f"the key of {name!r} is in the log"
        assert hashlib.sha256(key.encode()).hexdigest() not in text, f"the digest of {name!r} is in the log"
    assert WRONG_KEY not in text, "a refused key is in the log"


def write_config(directory: Path, config: dict) -> str:
    path = directory / "frontend.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def limits_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    rpm2 = {"requests_per_minute": 2, "tokens_per_minute": 100_000}
    config = {
        "models": [{"name": "m1"}, {"name": "m2", "aliases": ["m2-latest", "claude-*"]}],
        "keys": [
            {"name": "concurrent", "key": KEYS["concurrent"], "concurrent_requests": 3},
            {"name": "abandoning", "key": KEYS["abandoning"], "concurrent_requests": 2},
            {"name": "unlimited", "key": KEYS["unlimited"]},
            {"name": "per-minute", "key": KEYS["per-minute"], "requests_per_minute": 5},
            {"name": "tokens", "key": KEYS["tokens"], "tokens_per_minute": TOKENS_PER_MINUTE},
            {"name": "token-burst", "key": KEYS["token-burst"], "tokens_per_minute": 300},
            {"name": "restricted", "key": KEYS["restricted"], "models": ["m1"]},
            {"name": "anthropic-client", "key": KEYS["anthropic-client"], **rpm2},
            {"name": "openai-client", "key": KEYS["openai-client"], **rpm2},
            {"name": "responses-client", "key": KEYS["responses-client"], **rpm2},
            {"name": "background", "key": KEYS["background"], "tokens_per_minute": 50},
        ],
    }
    path = write_config(tmp_path_factory.mktemp("limits"), config)
    server = start_frontend("--config", path, "--sim-itl-ms", str(ITL_MS))
    try:
        yield server
    finally:
        server.stop()


def test_beyond_the_concurrency_limit_requests_are_refused_until_streams_finish(
    limits_server: Server,
) -> None:
    url, key = limits_server.url, KEYS["concurrent"]
    admitted: list[Outcome] = []
    lock = threading.Lock()

    def slow_stream(_: int) -> Outcome:
        outcome = post(url, CHAT, key, chat_body(max_tokens=SLOW_TOKENS, stream=True))
        with lock:
            if outcome.status == 200:
                admitted.append(outcome)
        return outcome

    with concurrent.futures.ThreadPoolExecutor(1) as runner:
        burst = runner.submit(send_together, 20, slow_stream)
        # the refusals are quick: once all 17 are counted, three streams are running ...
        wait_until(
            lambda: metric(url, "deepseek_frontend_key_rate_limited_total", key="concurrent") >= 17,
            "17 of the 20 streams were refused",
            timeout=REQUEST_TIMEOUT_S,
        )
        # ... and meanwhile a key without limits is served as usual
        unlimited = send_together(5, lambda _: post(url, CHAT, KEYS["unlimited"], chat_body()))
        unlimited_done = time.monotonic()
        first_wave = burst.result(timeout=REQUEST_TIMEOUT_S * 2)

    statuses = sorted(o.status for o in first_wave)
    assert statuses == [200] * 3 + [429] * 17, statuses
    for outcome in first_wave:
        if outcome.status == 429:
            assert_rate_limited_openai(outcome)
            assert "concurrent requests" in outcome.json()["error"]["message"]
    assert len(admitted) == 3
    assert most_at_once(admitted) <= 3
    # the admitted streams ran their whole length (the sim's pace), not cut short
    for outcome in admitted:
        assert outcome.ended - outcome.sent >= SLOW_TOKENS * ITL_MS / 1000 * 0.9
    # every refusal came while the three admitted streams were in flight
    for outcome in first_wave:
        if outcome.status == 429:
            overlapping = [a for a in admitted if a.sent < outcome.ended and a.ended > outcome.sent]
            assert len(overlapping) == 3
    assert [o.status for o in unlimited] == [200] * 5
    assert unlimited_done < min(o.ended for o in admitted), "the unlimited key was served after the streams"

    wait_until(
        lambda: metric(url, "deepseek_frontend_key_requests_total", key="concurrent", status="200") == 3,
        "the server counted the three streams finished",
        timeout=REQUEST_TIMEOUT_S,
    )
    assert (
        metric(url, "deepseek_frontend_key_rate_limited_total", key="concurrent", limit="concurrent_requests")
        == 17
    )
    # the slots are free again: three more streams at once are all admitted
    second_wave = send_together(3, lambda _: post(url, CHAT, key, chat_body(max_tokens=8, stream=True)))
    assert [o.status for o in second_wave] == [200] * 3


def test_streams_the_client_abandons_give_their_slots_back(limits_server: Server) -> None:
    url, key = limits_server.url, KEYS["abandoning"]
    # streams that would run for a minute: only their abandonment can free the slots in time
    endless = chat_body(max_tokens=60_000 // ITL_MS, stream=True)
    with contextlib.ExitStack() as open_streams:
        # the body iterators are kept: one collected early would close its connection
        bodies = []
        for _ in range(2):
            client = open_streams.enter_context(httpx.Client(timeout=REQUEST_TIMEOUT_S))
            response = open_streams.enter_context(
                client.stream("POST", url + CHAT, json=endless, headers={"authorization": f"Bearer {key}"})
            )
            assert response.status_code == 200
            bodies.append(response.iter_bytes())
            next(bodies[-1])  # the stream is running
        assert_rate_limited_openai(post(url, CHAT, key, chat_body()))
    # both connections are closed now

    def admitted_again() -> bool:
        return post(url, CHAT, key, chat_body()).status == 200

    wait_until(
        admitted_again, "a request of the key was admitted after its streams were abandoned", timeout=10
    )
    wait_until(
        lambda: metric(url, "deepseek_frontend_key_requests_total", key="abandoning", status="499") == 2,
        "both abandoned streams were counted as 499",
        timeout=10,
    )
    both = send_together(2, lambda _: post(url, CHAT, key, chat_body()))
    assert [o.status for o in both] == [200, 200]


def test_requests_per_minute_admit_exactly_the_limit_of_a_burst(limits_server: Server) -> None:
    url, key = limits_server.url, KEYS["per-minute"]
    outcomes = send_together(12, lambda _: post(url, CHAT, key, chat_body()))

    admitted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status != 200]
    assert len(admitted) == 5, [o.status for o in outcomes]
    assert len(refused) == 7
    # each admission took one request from the bucket of 5: the remaining counts go 4 .. 0
    assert sorted(int(o.headers["x-ratelimit-remaining-requests"]) for o in admitted) == [0, 1, 2, 3, 4]
    for outcome in outcomes:
        assert outcome.headers["x-ratelimit-limit-requests"] == "5"
        assert "x-ratelimit-limit-tokens" not in outcome.headers  # the key has no tokens limit
    for outcome in refused:
        assert_rate_limited_openai(outcome)
        assert "requests per minute" in outcome.json()["error"]["message"]
        assert outcome.headers["x-ratelimit-remaining-requests"] == "0"
        # one request comes back every 60 / 5 = 12 s
        assert 10 <= int(outcome.headers["retry-after"]) <= 12, outcome.headers["retry-after"]
    assert metric(url, "deepseek_frontend_key_rate_limited_total", key="per-minute", limit="requests") == 7
    assert (
        metric(url, "deepseek_frontend_key_requests_total", key="per-minute", model="m1", status="200") == 5
    )
    assert (
        metric(url, "deepseek_frontend_key_requests_total", key="per-minute", model="m1", status="429") == 7
    )


def test_tokens_per_minute_refuse_once_used_and_metrics_count_the_reported_usage(
    limits_server: Server,
) -> None:
    url, key, limit = limits_server.url, KEYS["tokens"], TOKENS_PER_MINUTE
    plain = chat_body(max_tokens=8, content=CACHEABLE_PROMPT)
    # a stream's usage comes in its last chunk, and counts like a plain answer's
    streamed = {**plain, "stream": True, "stream_options": {"include_usage": True}}
    admitted: list[Outcome] = []
    usages: list[dict] = []
    refused: Outcome | None = None
    used = 0
    first_sent = time.monotonic()
    for i in range(10):
        body = streamed if i % 2 else plain
        # what admission reserves: the prompt estimated from the body, and max_tokens
        reserved = estimate_prompt_tokens(body) + 8
        outcome = post(url, CHAT, key, body)
        refill = (time.monotonic() - first_sent) * limit / 60
        if outcome.status != 200:
            refused = outcome
            assert limit - used + refill < reserved + 1, "refused although its reservation fit"
            break
        # the head shows what the requests before it used and this one's reservation
        remaining = int(outcome.headers["x-ratelimit-remaining-tokens"])
        assert limit - used - reserved <= remaining <= limit - used - reserved + 1 + refill, (remaining, used)
        assert used + reserved <= limit + refill, "admitted although its reservation did not fit"
        usage = reported_usage(outcome)
        used += usage["prompt_tokens"] + usage["completion_tokens"]
        admitted.append(outcome)
        usages.append(usage)
    assert refused is not None, "never refused"
    assert len(admitted) >= 2
    assert_rate_limited_openai(refused)
    assert "tokens per minute" in refused.json()["error"]["message"]
    assert refused.headers["x-ratelimit-limit-tokens"] == str(limit)
    assert int(refused.headers["x-ratelimit-remaining-tokens"]) < reserved
    assert refused.headers["x-ratelimit-reset-tokens"].endswith("s")
    assert "x-ratelimit-limit-requests" not in refused.headers

    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    output = sum(u["completion_tokens"] for u in usages)
    assert cached > 0, "the repeated prompt should have come from the prefix cache"
    labels = {"key": "tokens", "model": "m1"}
    wait_until(
        lambda: metric(url, "deepseek_frontend_key_requests_total", status="200", **labels) == len(admitted),
        "the server counted every admitted request",
        timeout=10,
    )
    assert metric(url, "deepseek_frontend_key_prompt_tokens_total", **labels) == prompt
    assert metric(url, "deepseek_frontend_key_cached_tokens_total", **labels) == cached
    assert metric(url, "deepseek_frontend_key_output_tokens_total", **labels) == output
    assert metric(url, "deepseek_frontend_key_rate_limited_total", key="tokens", limit="tokens") == 1


def test_tokens_per_minute_bound_a_burst_of_concurrent_requests(limits_server: Server) -> None:
    """Twenty streams at once of a 300-tokens-a-minute key: each reserves its possible tokens at
    admission (prompt estimate + max_tokens = 50), so six are admitted -- the minute's tokens --
    and fourteen refused at once, not all twenty served and the tokens counted afterwards."""
    url, key, limit = limits_server.url, KEYS["token-burst"], 300
    body = {**chat_body(max_tokens=47, stream=True), "stream_options": {"include_usage": True}}
    reserved = estimate_prompt_tokens(body) + 47
    assert reserved == 50, reserved  # so the burst fits exactly six, and a seventh waits 10 s
    outcomes = send_together(20, lambda _: post(url, CHAT, key, body))

    admitted = [o for o in outcomes if o.status == 200]
    assert len(admitted) == limit // reserved, [o.status for o in outcomes]
    served = sum(reported_usage(o)["completion_tokens"] for o in admitted)
    assert served == 6 * 47 <= limit
    for outcome in outcomes:
        if outcome.status == 200:
            continue
        assert_rate_limited_openai(outcome)
        message = outcome.json()["error"]["message"]
        assert "tokens per minute" in message and f"this request may use {reserved}" in message
        assert 1 <= int(outcome.headers["retry-after"]) <= 10
    remaining = sorted(int(o.headers["x-ratelimit-remaining-tokens"]) for o in admitted)
    # each admission took 50: what is left after the last is what refilled meanwhile, under 50
    assert remaining[0] < reserved and remaining[-1] >= limit - reserved
    # the streams' prompts were longer than estimated: the difference is taken when they end
    wait_until(
        lambda: metric(url, "deepseek_frontend_key_requests_total", key="token-burst", status="200") == 6,
        "the six streams were counted",
        timeout=REQUEST_TIMEOUT_S,
    )
    late = post(url, CHAT, key, body)
    assert_rate_limited_openai(late)
    assert int(late.headers["retry-after"]) >= 10


def test_a_key_restricted_to_one_model_sees_no_other(limits_server: Server) -> None:
    url, key = limits_server.url, KEYS["restricted"]
    headers = {"authorization": f"Bearer {key}"}

    def listed(api_key: str) -> list[str]:
        r = httpx.get(url + "/v1/models", headers={"authorization": f"Bearer {api_key}"}, timeout=10)
        assert r.status_code == 200, r.text
        return sorted(m["id"] for m in r.json()["data"])

    assert listed(key) == ["m1"]
    assert listed(KEYS["unlimited"]) == ["m1", "m2", "m2-latest"]
    assert post(url, CHAT, key, chat_body("m1")).status == 200
    assert post(url, MESSAGES, key, messages_body("m1"), anthropic_style=True).status == 200

    # m2 exists, but for this key it is answered exactly like a model that does not, under any
    # of its names
    cases = [(CHAT, chat_body, False, name) for name in ("m2", "m2-latest", "claude-sonnet-4")]
    cases += [(MESSAGES, messages_body, True, name) for name in ("m2", "claude-sonnet-4")]
    for path, body_of, anthropic_style, name in cases:
        other = post(url, path, key, body_of(name), anthropic_style=anthropic_style)
        missing = post(url, path, key, body_of("no-such-model"), anthropic_style=anthropic_style)
        assert other.status == missing.status == 404, (path, name)
        assert other.json() == json.loads(missing.body.replace(b"no-such-model", name.encode()))
        if anthropic_style:
            assert other.json()["type"] == "error"
            assert other.json()["error"]["type"] == "not_found_error"
        else:
            assert other.json()["error"]["code"] == "model_not_found"
    retrieved = httpx.get(url + "/v1/models/m2", headers=headers, timeout=10)
    assert retrieved.status_code == 404
    assert httpx.get(url + "/v1/models/m1", headers=headers, timeout=10).status_code == 200
    # the unlimited key does reach m2, under its names
    for name in ("m2", "m2-latest", "claude-sonnet-4"):
        assert post(url, CHAT, KEYS["unlimited"], chat_body(name)).status == 200


def test_messages_carry_anthropic_rate_limit_headers(limits_server: Server) -> None:
    url, key = limits_server.url, KEYS["anthropic-client"]
    before = datetime.now(UTC).replace(microsecond=0)
    first = post(url, MESSAGES, key, messages_body(), anthropic_style=True)
    second = post(url, MESSAGES, key, messages_body(stream=True), anthropic_style=True)
    third = post(url, MESSAGES, key, messages_body(), anthropic_style=True)

    assert (first.status, second.status, third.status) == (200, 200, 429)
    assert b"message_stop" in second.body
    for outcome, remaining in ((first, "1"), (second, "0"), (third, "0")):
        h = outcome.headers
        assert h["anthropic-ratelimit-requests-limit"] == "2"
        assert h["anthropic-ratelimit-requests-remaining"] == remaining
        assert h["anthropic-ratelimit-tokens-limit"] == "100000"
        assert int(h["anthropic-ratelimit-tokens-remaining"]) > 99_000
        for reset in (h["anthropic-ratelimit-requests-reset"], h["anthropic-ratelimit-tokens-reset"]):
            # RFC 3339 UTC, no later than a full refill from now
            at = datetime.strptime(reset, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            assert before <= at <= before + timedelta(seconds=66)
        assert not [name for name in h if name.startswith("x-ratelimit-")]
    error = third.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "rate_limit_error"
    assert int(third.headers["retry-after"]) >= 1


def test_chat_completions_and_responses_carry_openai_rate_limit_headers(limits_server: Server) -> None:
    url = limits_server.url
    cases = (
        (CHAT, KEYS["openai-client"], chat_body(), chat_body(stream=True)),
        (
            RESPONSES,
            KEYS["responses-client"],
            {"model": "m1", "input": "hello", "max_output_tokens": 4},
            {"model": "m1", "input": "hello", "max_output_tokens": 4, "stream": True},
        ),
    )
    for path, key, plain, streamed in cases:
        first = post(url, path, key, plain)
        second = post(url, path, key, streamed)
        third = post(url, path, key, plain)
        assert (first.status, second.status, third.status) == (200, 200, 429), path
        assert second.headers["content-type"].startswith("text/event-stream")
        for outcome, remaining in ((first, "1"), (second, "0"), (third, "0")):
            h = outcome.headers
            assert h["x-ratelimit-limit-requests"] == "2"
            assert h["x-ratelimit-remaining-requests"] == remaining
            assert h["x-ratelimit-limit-tokens"] == "100000"
            assert int(h["x-ratelimit-remaining-tokens"]) > 99_000
            assert h["x-ratelimit-reset-requests"].endswith("s")
            assert h["x-ratelimit-reset-tokens"].endswith("s")
            assert not [name for name in h if name.startswith("anthropic-ratelimit-")]
        assert_rate_limited_openai(third)


def test_a_background_response_counts_its_tokens(limits_server: Server) -> None:
    url, key = limits_server.url, KEYS["background"]
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": "m1", "input": "hello", "max_output_tokens": 60, "ignore_eos": True, "background": True}
    queued = post(url, RESPONSES, key, body)
    assert queued.status == 200, queued.body
    response_id = queued.json()["id"]

    def generated() -> bool:
        # polled with the same key: admitted until the run's tokens are taken from its bucket
        r = httpx.get(f"{url}{RESPONSES}/{response_id}", headers=headers, timeout=REQUEST_TIMEOUT_S)
        return r.status_code == 429 or r.json()["status"] in ("completed", "incomplete")

    wait_until(generated, "the background response was generated", timeout=REQUEST_TIMEOUT_S)
    wait_until(
        lambda: metric(url, "deepseek_frontend_key_output_tokens_total", key="background", model="m1") == 60,
        "the key's usage counts the 60 generated tokens",
        timeout=5,
    )
    # 60 output tokens are more than the 50 per minute the key may use
    assert_rate_limited_openai(post(url, CHAT, key, chat_body()))


def test_the_log_never_holds_a_key(limits_server: Server) -> None:
    url = limits_server.url
    assert post(url, CHAT, KEYS["unlimited"], chat_body()).status == 200
    assert post(url, CHAT, WRONG_KEY, chat_body()).status == 401
    wait_until(lambda: "status=401" in limits_server.log(), "the refused request was logged", timeout=10)
    log = limits_server.log()
    assert "key_name=unlimited" in log
    assert_no_key_in(log)


def test_a_key_given_by_its_digest_authenticates_and_json_logs_hold_no_key(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    entries = [
        {"name": "hashed", "key_sha256": hashlib.sha256(KEYS["hashed"].encode()).hexdigest()},
        {"name": "plain", "key": KEYS["plain"]},
    ]
    keys_file.write_text(json.dumps({"keys": entries}), encoding="utf-8")
    # debug level: the most the server ever logs
    server = start_frontend("--keys-file", str(keys_file), "--log-format", "json", "--log-level", "debug")
    try:
        url = server.url
        for key in (KEYS["hashed"], KEYS["plain"]):
            assert post(url, CHAT, key, chat_body(model="deepseek-v4-flash")).status == 200
            assert (
                post(url, MESSAGES, key, messages_body("deepseek-v4-flash"), anthropic_style=True).status
                == 200
            )
        # the digest is not a key: presented as one, it is refused like any wrong key
        digest = entries[0]["key_sha256"]
        for wrong in (WRONG_KEY, digest):
            openai_style = post(url, CHAT, wrong, chat_body(model="deepseek-v4-flash"))
            assert openai_style.status == 401
            assert openai_style.json()["error"]["type"] == "authentication_error"
            anthropic_style = post(
                url, MESSAGES, wrong, messages_body("deepseek-v4-flash"), anthropic_style=True
            )
            assert anthropic_style.status == 401
            assert anthropic_style.json()["type"] == "error"
            assert anthropic_style.json()["error"]["type"] == "authentication_error"
        missing = httpx.post(url + CHAT, json=chat_body(model="deepseek-v4-flash"), timeout=REQUEST_TIMEOUT_S)
        assert missing.status_code == 401
    finally:
        log = server.stop()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    done = [r for r in records if r.get("message") == "request done" or r.get("msg") == "request done"]
    assert {r.get("key_name") for r in done} >= {"hashed", "plain", "-"}, done
    assert_no_key_in(log)


def both_processes_answer(url: str) -> bool:
    """Send a few requests of the unlimited key (a new connection each); whether both processes
    have answered some by now."""
    send_together(8, lambda _: post(url, CHAT, KEYS["unlimited"], chat_body(max_tokens=1)))
    served = per_process(url, "deepseek_frontend_key_requests_total", key="unlimited")
    return len(served) == 2


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = {
        "models": [{"name": "m1"}],
        "keys": [
            {"name": "shared-per-minute", "key": KEYS["shared-per-minute"], "requests_per_minute": 6},
            {"name": "shared-concurrent", "key": KEYS["shared-concurrent"], "concurrent_requests": 2},
            {"name": "unlimited", "key": KEYS["unlimited"]},
        ],
    }
    path = write_config(tmp_path_factory.mktemp("processes"), config)
    server = start_frontend("--config", path, "--workers", "2", "--sim-itl-ms", str(ITL_MS))
    try:
        # until both processes serve, one of them also accepts on the other's socket
        wait_until(
            lambda: both_processes_answer(server.url),
            "both frontend processes answered requests",
            timeout=60,
            interval=0,
        )
        yield server
    finally:
        server.stop()


def test_requests_per_minute_hold_across_processes(two_processes: Server) -> None:
    url, key = two_processes.url, KEYS["shared-per-minute"]
    # a new connection per request: the kernel spreads them over both processes' sockets
    outcomes = send_together(30, lambda _: post(url, CHAT, key, chat_body()))

    assert sorted(o.status for o in outcomes) == [200] * 6 + [429] * 24
    seen = per_process(url, "deepseek_frontend_key_requests_total", key="shared-per-minute")
    assert len(seen) == 2 and min(seen.values()) >= 1, f"not both processes were asked: {seen}"
    assert sum(seen.values()) == 30
    admitted = per_process(url, "deepseek_frontend_key_requests_total", key="shared-per-minute", status="200")
    assert sum(admitted.values()) == 6


def test_concurrent_requests_hold_across_processes(two_processes: Server) -> None:
    url, key = two_processes.url, KEYS["shared-concurrent"]
    outcomes = send_together(
        12, lambda _: post(url, CHAT, key, chat_body(max_tokens=SLOW_TOKENS, stream=True))
    )

    admitted = [o for o in outcomes if o.status == 200]
    assert sorted(o.status for o in outcomes) == [200] * 2 + [429] * 10
    assert most_at_once(admitted) <= 2
    for outcome in outcomes:
        if outcome.status == 429:
            assert_rate_limited_openai(outcome)
    wait_until(
        lambda: (
            sum(per_process(url, "deepseek_frontend_key_requests_total", key="shared-concurrent").values())
            == 12
        ),
        "both processes counted every request",
        timeout=REQUEST_TIMEOUT_S,
    )
    seen = per_process(url, "deepseek_frontend_key_requests_total", key="shared-concurrent")
    assert len(seen) == 2 and min(seen.values()) >= 1, f"not both processes were asked: {seen}"
    # the slots are given back in every process: two streams at once are admitted again
    again = send_together(2, lambda _: post(url, CHAT, key, chat_body(max_tokens=8, stream=True)))
    assert [o.status for o in again] == [200, 200]
