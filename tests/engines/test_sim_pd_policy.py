"""The simulated PD roles follow SGLang 0.5.23's defaults (``--disaggregation-decode-allocation-policy
early``; ``disaggregation/prefill.py``, ``disaggregation/decode.py``, ``disaggregation/common/conn.py``):

* a prefill computes nothing until its decode worker has pre-allocated the KV, so a decode worker
  whose pool is full holds the prefill of the next request;
* the prefill's bootstrap timeout counts from the request's arrival at the prefill worker;
* a prefill answers at its scheduler's next poll after the transfer: after the forward in progress;
* a decode whose KV never arrives fails after its waiting timeout with SGLang's abort (status 500).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.servers import Server, start_sim_engine
from tests.support.waiting import wait_until

from .conftest import prompt_ids

pytestmark = pytest.mark.slow


def stats(server: Server) -> dict[str, Any]:
    return httpx.get(server.url + "/sim/stats", timeout=10).json()


def trio(prefill: Server, room: int) -> dict[str, Any]:
    port = httpx.get(prefill.url + "/server_info", timeout=10).json()["disaggregation_bootstrap_port"]
    return {"bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room}


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


def prefill_sim(*extra: str) -> Any:
    return start_sim_engine(
        "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0", *extra
    )


@pytest.fixture(scope="module")
def small_decode() -> Iterator[tuple[Server, Server]]:
    """A decode sim whose pool holds one request of ~100 prompt tokens plus 400 new ones at a time."""
    with (
        prefill_sim("--disaggregation-bootstrap-timeout", "60") as pre,
        start_sim_engine(
            "--disaggregation-mode", "decode", "--itl-ms", "10", "--max-total-tokens", "600"
        ) as dec,
    ):
        yield pre, dec


def test_a_decode_that_cannot_allocate_holds_its_prefill(small_decode: tuple[Server, Server]) -> None:
    pre, dec = small_decode
    ids = prompt_ids("Write 300 words about lighthouses.")
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 400}, "stream": True}

    async def scenario() -> tuple[httpx.Response, ...]:
        async with httpx.AsyncClient(timeout=60) as client:
            first = {**body, "rid": "first", **trio(pre, 5001)}
            legs = [asyncio.ensure_future(client.post(s.url + "/generate", json=first)) for s in (pre, dec)]
            await asyncio.to_thread(wait_until, lambda: stats(dec)["running"] == 1, "the first decode runs")
            started = stats(pre)["started"]
            second = {**body, "rid": "second", **trio(pre, 5002)}
            legs += [asyncio.ensure_future(client.post(s.url + "/generate", json=second)) for s in (pre, dec)]
            await asyncio.to_thread(
                wait_until, lambda: stats(dec)["pd_memory_waiting"] == 1, "the second decode waits for memory"
            )
            # its prefill arrived and waits for the decode's allocation: nothing computed
            waiting = stats(pre)
            assert waiting["pd_rooms_waiting_for_decode"] == 1 and waiting["started"] == started
            assert not legs[0].done() or legs[1].done() is False
            return tuple(await asyncio.gather(*legs))

    first_p, first_d, second_p, second_d = asyncio.run(scenario())
    for leg in (first_p, first_d, second_p, second_d):
        assert leg.status_code == 200
        assert events(leg.text)[-1]["meta_info"]["finish_reason"]["type"] in ("length", "stop"), leg.text
    assert stats(pre)["pd_rooms_waiting_for_decode"] == 0 and stats(dec)["pd_memory_used_tokens"] == 0


def test_the_bootstrap_timeout_counts_from_the_prefills_arrival() -> None:
    with (
        prefill_sim("--disaggregation-bootstrap-timeout", "1") as pre,
        start_sim_engine(
            "--disaggregation-mode", "decode", "--itl-ms", "20", "--max-total-tokens", "600"
        ) as dec,
    ):
        ids = prompt_ids("Write 300 words about lighthouses.")
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 400}}

        async def scenario() -> tuple[httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                first = {**body, "rid": "first", "stream": True, **trio(pre, 6001)}
                held = [
                    asyncio.ensure_future(client.post(s.url + "/generate", json=first)) for s in (pre, dec)
                ]
                await asyncio.to_thread(
                    wait_until, lambda: stats(dec)["running"] == 1, "the first decode runs"
                )
                second = {**body, "rid": "second", **trio(pre, 6002)}
                # the decode cannot allocate for 8 s (400 tokens at 20 ms): the prefill gives up first
                prefill, decode = await asyncio.gather(
                    client.post(pre.url + "/generate", json=second),
                    client.post(dec.url + "/generate", json=second),
                )
                for leg in held:
                    leg.cancel()
                return prefill, decode

        started = time.monotonic()
        prefill, decode = asyncio.run(scenario())
        assert prefill.status_code == 500
        assert prefill.json()["message"].startswith(
            "Prefill bootstrap failed for request rank=0 req.rid='second' req.bootstrap_room=6002 with "
            "exception KVTransferError(bootstrap_room=6002): Request 6002 timed out after 1"
        )
        assert prefill.json()["message"].endswith("s in KVPoll.Bootstrapping")
        # the decode learns it from the prefill's bootstrap server and fails the same room
        assert decode.status_code == 500 and decode.json()["message"].startswith("Decode transfer failed")
        assert time.monotonic() - started < 8, "it did not wait for the decode's memory"


def test_a_prefill_answers_after_the_forward_in_progress() -> None:
    """Request S's KV goes out (paced: 0.3 s) while a long prompt L starts its prefill in 1-second
    chunks: S's decode has its first token as soon as the KV is in, S's prefill answers only once L's
    chunk in progress is done."""
    cache = (
        "--kv-cache-tokens",
        "100000",
        "--prefill-us-per-token",
        "1000",
        "--chunked-prefill-size",
        "1000",
    )
    pace = ("--transfer-bandwidth-mbps", "0.5")
    with prefill_sim(*cache, *pace) as pre, start_sim_engine("--disaggregation-mode", "decode") as dec:
        short = prompt_ids("Summarise this. " + "The quick brown fox jumps over the lazy dog. " * 25)
        long = prompt_ids("Summarise this. " + "The quick brown fox jumps over the lazy dog. " * 300)
        assert 200 < len(short) < 400 and len(long) > 3000

        async def answered(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> float:
            await client.post(url + "/generate", json=body)
            return time.monotonic()

        async def first_token(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> float:
            async with client.stream("POST", url + "/generate", json={**body, "stream": True}) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        return time.monotonic()
            raise AssertionError("no chunk")

        async def scenario() -> tuple[float, float]:
            async with httpx.AsyncClient(timeout=60) as client:
                s_body = {
                    "input_ids": short,
                    "sampling_params": {"max_new_tokens": 5},
                    "rid": "s",
                    **trio(pre, 7001),
                }
                l_body = {
                    "input_ids": long,
                    "sampling_params": {"max_new_tokens": 1},
                    "rid": "l",
                    **trio(pre, 7002),
                }
                s_prefill = asyncio.ensure_future(answered(client, pre.url, s_body))
                s_decode = asyncio.ensure_future(first_token(client, dec.url, s_body))
                await asyncio.sleep(0.1)  # S's prefill (0.3 s) runs; L's legs arrive and wait for it
                legs = [
                    asyncio.ensure_future(client.post(s.url + "/generate", json=l_body)) for s in (pre, dec)
                ]
                done = await asyncio.gather(s_prefill, s_decode)
                await asyncio.gather(*legs)
                return done[0], done[1]

        prefill_answered, decode_first = asyncio.run(scenario())
        # S's decode had its KV at about 0.3 s; L's first chunk ran from about 0.3 s to 1.3 s
        assert prefill_answered - decode_first > 0.5


def test_a_decode_whose_kv_never_arrives_fails_after_its_waiting_timeout_like_sglang() -> None:
    with (
        prefill_sim() as pre,
        start_sim_engine("--disaggregation-mode", "decode", "--disaggregation-waiting-timeout", "0.5") as dec,
    ):
        httpx.post(pre.url + "/sim/fault", json={"pd_transfer": "hang"}, timeout=10)
        body = {"input_ids": prompt_ids("Hello"), "sampling_params": {"max_new_tokens": 20}, "rid": "lost"}
        body.update(trio(pre, 8001))

        async def scenario() -> tuple[httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                return await asyncio.gather(
                    client.post(pre.url + "/generate", json=body),
                    client.post(dec.url + "/generate", json={**body, "stream": True}),
                )

        prefill, decode = asyncio.run(scenario())
        (event,) = events(decode.text)
        finish = event["meta_info"]["finish_reason"]
        assert (finish["type"], finish["status_code"]) == ("abort", 500)
        assert finish["message"].startswith(
            "Decode transfer failed for request rank=0 decode_req.req.rid='lost' "
            "decode_req.req.bootstrap_room=8001"
        )
        assert finish["message"].endswith("s in KVPoll.WaitingForInput")
        # the decode's abort reaches the prefill worker, whose leg fails in turn
        assert prefill.status_code == 500 and prefill.json()["message"].endswith("Aborted by AbortReq.")
        assert stats(pre)["pd_rooms_open"] == 0
