"""End to end over real HTTP: ``serve --prefill-worker/--decode-worker`` over sim-engine processes in
SGLang's PD roles (the decode sim fetches the room's KV from the prefill sim's bootstrap port over TCP).

* a disaggregated answer is the one an aggregated worker gives, streamed or not, on both APIs' SDKs;
* a worker started in the wrong role keeps the frontend from starting, with a message naming it;
* a decode leg that cannot reach the prefill's bootstrap port fails the request (503) with no room or
  leg left behind on either worker; a client that leaves mid-stream leaves nothing running either;
* a prefill that never sends the KV ends the request at the transfer timeout (504), not at the
  decode's own waiting timeout, with both legs aborted;
* a prefill or decode worker given as a plain ``--worker`` stops ``serve`` with one line naming it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.support.metrics import samples
from tests.support.servers import Server, free_port, start_frontend, start_sim_engine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Write forty words about the sea. " + "Waves roll. " * 60}]


def prefill_sim(*extra: str) -> Server:
    return start_sim_engine(
        "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0", *extra
    )


def decode_sim(*extra: str) -> Server:
    return start_sim_engine(
        "--disaggregation-mode", "decode", "--disaggregation-handshake-timeout", "1", *extra
    )


def sim_stats(server: Server) -> dict[str, object]:
    return httpx.get(server.url + "/sim/stats", timeout=5).json()


def metric(server: Server, name: str) -> dict[str, float]:
    return samples(httpx.get(server.url + "/metrics", timeout=5).text, name)


def nothing_running(*servers: Server) -> bool:
    for s in servers:
        stats = sim_stats(s)
        if stats["running"] or stats.get("pd_rooms_open") or stats.get("pd_fetching"):
            return False
    return True


@pytest.fixture(scope="module")
def pd_pair() -> Iterator[tuple[Server, Server, Server]]:
    with (
        prefill_sim() as p,
        decode_sim("--itl-ms", "20") as d,
        start_frontend(
            "--prefill-worker", p.url, "--decode-worker", d.url, "--health-check-interval", "300"
        ) as fe,
    ):
        yield fe, p, d


@pytest.fixture(scope="module")
def aggregated() -> Iterator[Server]:
    with start_sim_engine() as w, start_frontend("--worker", w.url, "--health-check-interval", "300") as fe:
        yield fe


def test_a_disaggregated_answer_is_the_aggregated_one(
    pd_pair: tuple[Server, Server, Server], aggregated: Server
) -> None:
    fe, p, d = pd_pair
    pd_client = openai.OpenAI(base_url=fe.url + "/v1", api_key="x", max_retries=0, timeout=60)
    agg_client = openai.OpenAI(base_url=aggregated.url + "/v1", api_key="x", max_retries=0, timeout=60)
    kwargs = {"model": "deepseek-v4-flash", "messages": MESSAGES, "temperature": 0, "max_tokens": 60}
    expected = agg_client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    got = pd_client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    assert got.choices[0].message.content == expected.choices[0].message.content
    assert got.usage is not None and expected.usage is not None
    assert got.usage.prompt_tokens == expected.usage.prompt_tokens
    assert got.usage.completion_tokens == expected.usage.completion_tokens
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in pd_client.chat.completions.create(stream=True, **kwargs)  # type: ignore[call-overload]
        if c.choices
    )
    assert streamed == expected.choices[0].message.content
    # the decode sim received the prompt's KV from the prefill sim, once per request
    transfers = sim_stats(d)["pd_transfers"]
    assert isinstance(transfers, list) and len(transfers) >= 2
    assert all(t["tokens"] == expected.usage.prompt_tokens for t in transfers[-2:])
    wait_until(  # a request is counted once its prefill answer has been checked too
        lambda: metric(fe, "deepseek_frontend_pd_requests_total").get('{outcome="ok"}', 0) >= 2,
        "both requests counted",
    )
    # each role's router is exported, told apart by a role label (the names are the aggregated ones)
    decisions = metric(fe, "deepseek_frontend_routing_decisions_total")
    for role in ("prefill", "decode"):
        assert decisions.get(f'{{reason="single-candidate",role="{role}"}}', 0) >= 2, decisions
        assert f'{{role="{role}"}}' in metric(fe, "deepseek_frontend_routing_choose_total")
    prompts = metric(fe, "deepseek_frontend_worker_prompt_tokens_total")
    assert (
        prompts[f'{{role="prefill",worker="{p.url}"}}'] > 0
        and prompts[f'{{role="decode",worker="{d.url}"}}'] > 0
    )
    wait_until(lambda: nothing_running(p, d), "both legs finished")


def test_an_anthropic_client_gets_the_aggregated_answer_too(
    pd_pair: tuple[Server, Server, Server], aggregated: Server
) -> None:
    fe, _, _ = pd_pair
    answers = []
    for server in (aggregated, fe):
        client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)
        message = client.messages.create(model="deepseek-v4-flash", messages=MESSAGES, max_tokens=60)  # type: ignore[arg-type]
        answers.append(([b.model_dump() for b in message.content], message.usage.output_tokens))
    assert answers[0] == answers[1]


def test_a_client_leaving_mid_stream_leaves_no_leg_running(pd_pair: tuple[Server, Server, Server]) -> None:
    fe, p, d = pd_pair
    body = {"model": "deepseek-v4-flash", "messages": MESSAGES, "max_tokens": 500, "stream": True}
    with httpx.stream("POST", fe.url + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                break  # a token arrived: leave mid-stream
    wait_until(lambda: nothing_running(p, d), "both legs aborted")
    wait_until(
        lambda: metric(fe, "deepseek_frontend_pd_requests_total").get('{outcome="client_gone"}', 0) >= 1,
        "the request counted as client_gone",
    )


def test_a_worker_in_the_wrong_role_keeps_the_frontend_from_starting() -> None:
    with prefill_sim() as p, decode_sim() as d:
        args = ["serve", "--port", str(free_port()), "--prefill-worker", d.url, "--decode-worker", p.url]
        done = subprocess.run(
            [sys.executable, "-m", "deepseek_frontend", *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode != 0
        assert f"{d.url} was given as --prefill-worker" in done.stderr + done.stdout
        assert 'disaggregation_mode "decode"' in done.stderr + done.stdout


def test_an_unreachable_bootstrap_port_fails_the_request_with_nothing_left_behind() -> None:
    unused = str(free_port())
    with prefill_sim("--disaggregation-bootstrap-timeout", "30") as p, decode_sim() as d:
        args = [
            "--prefill-worker",
            p.url,
            "--decode-worker",
            d.url,
            "--disaggregation-bootstrap-port",
            unused,
        ]
        with start_frontend(*args, "--health-check-interval", "300") as fe:
            r = httpx.post(
                fe.url + "/v1/chat/completions",
                json={"model": "deepseek-v4-flash", "messages": MESSAGES, "max_tokens": 20},
                timeout=60,
            )
            assert r.status_code == 503, r.text
            # the client gets a stable message with its request id; the handshake failure is logged
            request_id = r.headers["x-request-id"]
            assert r.json()["error"]["message"].startswith("worker unavailable: "), r.text
            assert request_id in r.json()["error"]["message"]
            logged = [line for line in fe.log().splitlines() if f"request_id={request_id}" in line]
            assert any("handshake" in line.lower() for line in logged), fe.log()
            # the prefill legs that waited for a decode were aborted: no room is held
            wait_until(lambda: nothing_running(p, d), "no leg or room left")
            assert metric(fe, "deepseek_frontend_pd_pair_retries_total")[""] == 1
            assert metric(fe, "deepseek_frontend_pd_transfer_failures_total")[""] == 2


def test_a_prefill_that_never_sends_the_kv_ends_at_the_transfer_timeout() -> None:
    """Neither leg answers (the prefill sim holds the KV; the decode sim would wait its 300 s): the
    transfer timeout fires on whichever leg is missing."""
    with prefill_sim() as p, decode_sim() as d:
        httpx.post(p.url + "/sim/fault", json={"pd_transfer": "hang"}, timeout=10)
        args = ("--prefill-worker", p.url, "--decode-worker", d.url, "--pd-transfer-timeout", "2")
        with start_frontend(*args, "--health-check-interval", "300") as fe:
            body = {"model": "deepseek-v4-flash", "messages": MESSAGES, "max_tokens": 20}
            r = httpx.post(fe.url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 504, r.text
            assert "--pd-transfer-timeout" in r.json()["error"]["message"]
            wait_until(lambda: nothing_running(p, d), "both legs aborted, no room held")
            assert metric(fe, "deepseek_frontend_pd_requests_total")['{outcome="transfer_timeout"}'] == 1


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pd_worker_given_as_a_plain_worker_keeps_the_frontend_from_starting(role: str) -> None:
    starter = prefill_sim if role == "prefill" else decode_sim
    with starter() as w:
        args = ["serve", "--port", str(free_port()), "--worker", w.url]
        done = subprocess.run(
            [sys.executable, "-m", "deepseek_frontend", *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode != 0
        output = done.stderr + done.stdout
        reported = f'{w.url} reports disaggregation_mode "{role}" (an SGLang {role} worker)'
        assert f"{reported} but was given as --worker" in output
