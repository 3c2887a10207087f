"""The simulated engine in SGLang's PD roles, as real processes over real HTTP and real TCP.

A prefill sim and a decode sim get the same ``/generate`` body with the bootstrap trio, both at once
(as SGLang's gateway and Dynamo send it); the decode sim fetches the room's KV from the prefill
sim's bootstrap port and writes what an aggregated sim writes. Failures read as SGLang's do.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from deepseek_frontend.engines.sim.disagg import BootstrapServer, DisaggSettings, fetch_kv
from tests.support.servers import Server, free_port, start_sim_engine
from tests.support.waiting import wait_until

from .conftest import prompt_ids

KV_BYTES = 64
#: 8 Mbit/s: a 4000-token prompt's 256 KB take a quarter of a second
BANDWIDTH_MBPS = 8.0
CACHE = ("--kv-cache-tokens", "1000000", "--prefill-us-per-token", "1")


@pytest.fixture(scope="module")
def aggregated() -> Iterator[Server]:
    with start_sim_engine(*CACHE) as server:
        yield server


@pytest.fixture(scope="module")
def prefill() -> Iterator[Server]:
    with start_sim_engine(
        *CACHE,
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        "0",
        "--kv-bytes-per-token",
        str(KV_BYTES),
        "--transfer-bandwidth-mbps",
        str(BANDWIDTH_MBPS),
        "--disaggregation-bootstrap-timeout",
        "60",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def decode() -> Iterator[Server]:
    with start_sim_engine(*CACHE, "--disaggregation-mode", "decode") as server:
        yield server


@pytest.fixture(scope="module")
def impatient() -> Iterator[tuple[Server, Server]]:
    """A prefill and a decode sim whose SGLang timeouts are half a second."""
    short = ("--disaggregation-waiting-timeout", "0.5", "--disaggregation-handshake-timeout", "0.5")
    with (
        start_sim_engine(
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            "0",
            "--disaggregation-bootstrap-timeout",
            "0.5",
        ) as pre,
        start_sim_engine("--disaggregation-mode", "decode", *short) as dec,
    ):
        yield pre, dec


def info(server: Server) -> dict[str, Any]:
    return httpx.get(server.url + "/server_info", timeout=10).json()


def stats(server: Server) -> dict[str, Any]:
    return httpx.get(server.url + "/sim/stats", timeout=10).json()


def trio(prefill: Server, room: int) -> dict[str, Any]:
    return {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": info(prefill)["disaggregation_bootstrap_port"],
        "bootstrap_room": room,
    }


def events(text: str) -> list[dict[str, Any]]:
    """The JSON events of an SSE body (``[DONE]`` left out)."""
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]


def body_for(ids: list[int], **extra: Any) -> dict[str, Any]:
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": 60}, **extra}


async def both_legs(
    prefill: Server, decode: Server, body: dict[str, Any]
) -> tuple[httpx.Response, httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(
            client.post(prefill.url + "/generate", json=body),
            client.post(decode.url + "/generate", json=body),
        )


def test_each_role_reports_itself_in_server_info_like_sglang(
    aggregated: Server, prefill: Server, decode: Server
) -> None:
    plain, pre, dec = info(aggregated), info(prefill), info(decode)
    assert (plain["disaggregation_mode"], plain["disaggregation_bootstrap_port"]) == ("null", 8998)
    assert (dec["disaggregation_mode"], dec["disaggregation_bootstrap_port"]) == ("decode", 8998)
    assert pre["disaggregation_mode"] == "prefill"
    port = pre["disaggregation_bootstrap_port"]
    assert port != 8998 and f"sim-engine bootstrap port {port}" in prefill.log()
    assert plain["chunked_prefill_size"] == 8192  # SGLang's default on an H100/H200-class GPU


def test_a_pd_pair_writes_what_the_aggregated_worker_writes(
    aggregated: Server, prefill: Server, decode: Server
) -> None:
    ids = prompt_ids("Tell me about the weather on Mars, briefly.")
    alone = httpx.post(aggregated.url + "/generate", json=body_for(ids), timeout=60).json()
    body = body_for(ids, stream=True, **trio(prefill, 1001))
    pre, dec = asyncio.run(both_legs(prefill, decode, body))
    assert pre.status_code == dec.status_code == 200
    decoded = events(dec.text)
    assert [t for e in decoded for t in e["output_ids"]] == alone["output_ids"]
    assert decoded[-1]["meta_info"]["finish_reason"] == alone["meta_info"]["finish_reason"]
    assert decoded[-1]["meta_info"]["completion_tokens"] == len(alone["output_ids"])
    # the prefill leg answers once the KV is handed over: the first token, finished by length 0
    (answer,) = events(pre.text)
    assert answer["output_ids"] == alone["output_ids"][:1]
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert answer["meta_info"]["completion_tokens"] == 1
    assert pre.text.endswith("data: [DONE]\n\n")
    (transfer,) = [t for t in stats(decode)["pd_transfers"] if t["room"] == 1001]
    assert transfer["tokens"] == len(ids) and transfer["bytes"] == len(ids) * KV_BYTES


def test_a_non_streaming_pair_answers_in_one_object_each(
    aggregated: Server, prefill: Server, decode: Server
) -> None:
    ids = prompt_ids("What is two plus two?")
    alone = httpx.post(aggregated.url + "/generate", json=body_for(ids), timeout=60).json()
    pre, dec = asyncio.run(both_legs(prefill, decode, body_for(ids, **trio(prefill, 1002))))
    assert dec.json()["output_ids"] == alone["output_ids"]
    assert pre.json()["output_ids"] == alone["output_ids"][:1]


def test_the_kv_sent_grows_with_the_prompt_and_is_paced_to_the_bandwidth(
    prefill: Server, decode: Server
) -> None:
    short = prompt_ids("Hi.")
    long = prompt_ids("Summarise this. " + "The quick brown fox jumps over the lazy dog. " * 400)
    assert len(long) > 3000
    sent_before = stats(prefill)["pd_bytes_sent"]
    for room, ids in ((1003, short), (1004, long)):
        pre, dec = asyncio.run(both_legs(prefill, decode, body_for(ids, **trio(prefill, room))))
        assert pre.status_code == dec.status_code == 200, (pre.text, dec.text)
    transfers = {t["room"]: t for t in stats(decode)["pd_transfers"]}
    assert transfers[1003]["bytes"] == len(short) * KV_BYTES
    assert transfers[1004]["bytes"] == len(long) * KV_BYTES
    assert stats(prefill)["pd_bytes_sent"] - sent_before == (len(short) + len(long)) * KV_BYTES
    # paced: all but the first 64 KB slice wait for the bandwidth (a lower bound, not a speed claim)
    paced_s = (len(long) * KV_BYTES - 64 * 1024) * 8 / (BANDWIDTH_MBPS * 1e6)
    assert transfers[1004]["transfer_ms"] >= 0.5 * paced_s * 1000 > transfers[1003]["transfer_ms"]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pd_worker_refuses_a_request_without_a_room_like_sglang(
    role: str, prefill: Server, decode: Server
) -> None:
    server = prefill if role == "prefill" else decode
    body = body_for(prompt_ids("Hello"), rid="no-room")
    plain = httpx.post(server.url + "/generate", json=body, timeout=30)
    message = "Invalid request: Disaggregated request received without bootstrap room id. req.rid='no-room'"
    assert (plain.status_code, plain.json()) == (400, {"error": {"message": message}})
    streamed = httpx.post(server.url + "/generate", json={**body, "stream": True}, timeout=30)
    assert streamed.status_code == 200
    (event,) = events(streamed.text)
    assert event["output_ids"] == []
    assert event["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": message,
        "status_code": 400,
        "err_type": None,
    }


def test_a_room_that_never_arrives_fails_the_decode_leg_like_sglang(
    impatient: tuple[Server, Server],
) -> None:
    pre, dec = impatient
    body = body_for(prompt_ids("Hello"), rid="lonely", **trio(pre, 2001))
    streamed = httpx.post(dec.url + "/generate", json={**body, "stream": True}, timeout=30)
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    (event,) = events(streamed.text)
    finish = event["meta_info"]["finish_reason"]
    assert (finish["type"], finish["status_code"]) == ("abort", 500)
    assert finish["message"].startswith(
        "Decode transfer failed for request rank=0 decode_req.req.rid='lonely' "
        "decode_req.req.bootstrap_room=2001 with exception KVTransferError(bootstrap_room=2001): "
        "Request 2001 timed out after "
    )
    assert finish["message"].endswith("s in KVPoll.WaitingForInput")
    plain = httpx.post(dec.url + "/generate", json={**body, "bootstrap_room": 2002}, timeout=30)
    assert plain.status_code == 500
    error = plain.json()
    assert (error["object"], error["type"], error["code"]) == ("error", "500", 500)
    assert error["message"].startswith("Decode transfer failed for request rank=0")


def test_an_unreachable_bootstrap_port_fails_the_handshake_like_sglang(
    impatient: tuple[Server, Server],
) -> None:
    _, dec = impatient
    body = body_for(prompt_ids("Hello"), rid="nobody", bootstrap_host="127.0.0.1")
    body.update(bootstrap_port=free_port(), bootstrap_room=2003, stream=True)
    (event,) = events(httpx.post(dec.url + "/generate", json=body, timeout=30).text)
    assert event["meta_info"]["finish_reason"]["message"] == (
        "Decode handshake failed for request rank=0 decode_req.req.rid='nobody' "
        "decode_req.req.bootstrap_room=2003 with exception KVTransferError(bootstrap_room=2003): "
        "Aborted by AbortReq."
    )
    assert stats(dec)["pd_failures"]["handshake"] >= 1


def test_a_prefill_no_decode_fetches_fails_after_the_bootstrap_timeout(
    impatient: tuple[Server, Server],
) -> None:
    pre, _ = impatient
    body = body_for(prompt_ids("Hello"), rid="unfetched", **trio(pre, 2004))
    answer = httpx.post(pre.url + "/generate", json=body, timeout=30)
    assert answer.status_code == 500
    assert answer.json()["message"].startswith(
        "Prefill bootstrap failed for request rank=0 req.rid='unfetched' req.bootstrap_room=2004 "
        "with exception KVTransferError(bootstrap_room=2004): Request 2004 timed out after "
    )
    assert stats(pre)["pd_rooms_open"] == 0, "the room's KV is dropped"


def test_abort_ends_a_decode_leg_waiting_for_its_room_and_the_room_is_never_reused(
    prefill: Server, decode: Server
) -> None:
    body = body_for(prompt_ids("Hello"), rid="leg-d", stream=True, **trio(prefill, 3001))

    async def scenario() -> str:
        async with httpx.AsyncClient(timeout=60) as client:
            leg = asyncio.ensure_future(client.post(decode.url + "/generate", json=body))
            while not stats(decode)["pd_fetching"]:
                assert not leg.done(), leg
                await asyncio.sleep(0.02)
            await client.post(decode.url + "/abort_request", json={"rid": "leg-d"})
            return (await leg).text

    (event,) = events(asyncio.run(scenario()))
    finish = event["meta_info"]["finish_reason"]
    assert (finish["type"], finish["status_code"]) == ("abort", 500)
    assert finish["message"].endswith("KVTransferError(bootstrap_room=3001): Aborted by AbortReq.")
    # the decode told the prefill worker: a prefill leg arriving late for that room fails at once
    wait_until(lambda: stats(prefill)["pd_rooms_open"] == 0, "the prefill sim forgot the room")
    late = httpx.post(prefill.url + "/generate", json={**body, "rid": "leg-p", "stream": False}, timeout=30)
    assert late.status_code == 500
    assert late.json()["message"].endswith("Duplicate or cancelled bootstrap room")


def test_abort_ends_a_prefill_leg_holding_its_room(prefill: Server) -> None:
    body = body_for(prompt_ids("Hello"), rid="held", **trio(prefill, 3002))

    async def scenario() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as client:
            leg = asyncio.ensure_future(client.post(prefill.url + "/generate", json=body))
            while not stats(prefill)["pd_rooms_open"]:
                assert not leg.done(), leg
                await asyncio.sleep(0.02)
            await client.post(prefill.url + "/abort_request", json={"rid": "held"})
            return await leg

    answer = asyncio.run(scenario())
    assert answer.status_code == 500
    assert answer.json()["message"] == (
        "Prefill transfer failed for request rank=0 req.rid='held' req.bootstrap_room=3002 "
        "with exception KVTransferError(bootstrap_room=3002): Aborted by AbortReq."
    )
    assert stats(prefill)["pd_rooms_open"] == 0


def test_a_decode_leg_whose_prompt_is_not_the_rooms_fails_the_kv_check(
    prefill: Server, decode: Server
) -> None:
    room = trio(prefill, 3003)
    body = body_for(prompt_ids("Hello"), **room)
    other = body_for(prompt_ids("Goodbye"), **room)

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                client.post(prefill.url + "/generate", json=body),
                client.post(decode.url + "/generate", json=other),
            )

    pre, dec = asyncio.run(scenario())
    assert dec.status_code == 500 and dec.json()["message"].endswith("KV checksum mismatch")
    assert pre.status_code == 500 and pre.json()["message"].endswith("Aborted by AbortReq.")


def test_dp_rank_hints_are_checked_against_the_one_rank_a_sim_has(
    aggregated: Server, prefill: Server, decode: Server
) -> None:
    ids = prompt_ids("Hello")
    fine = httpx.post(aggregated.url + "/generate", json=body_for(ids, routed_dp_rank=0), timeout=30)
    assert fine.status_code == 200, "rank 0 of one is ignored"
    wrong = httpx.post(aggregated.url + "/generate", json=body_for(ids, routed_dp_rank=1), timeout=30)
    assert (wrong.status_code, wrong.json()) == (
        400,
        {"error": {"message": "routed_dp_rank=1 out of range [0, 1)"}},
    )
    # the decode leg's hint names the prefill worker's rank holding the room: a rank it lacks fails
    body = body_for(ids, rid="rank-1", stream=True, disagg_prefill_dp_rank=1, **trio(prefill, 4001))
    (event,) = events(httpx.post(decode.url + "/generate", json=body, timeout=30).text)
    assert event["meta_info"]["finish_reason"]["message"] == (
        "Decode handshake failed for request rank=0 decode_req.req.rid='rank-1' "
        "decode_req.req.bootstrap_room=4001 with exception KVTransferError(bootstrap_room=4001): "
        "Could not fetch bootstrap info for: prefill_dp_rank: 1 prefill_cp_rank: 0 target_tp_rank: 0 "
        "and target_pp_rank 0"
    )
    ok = body_for(ids, disagg_prefill_dp_rank=0, routed_dp_rank=0, **trio(prefill, 4002))
    pre, dec = asyncio.run(both_legs(prefill, decode, ok))
    assert pre.status_code == dec.status_code == 200


def test_a_decode_that_connects_before_the_room_opens_gets_a_small_unpaced_room() -> None:
    """The decode leg often reaches the bootstrap port before its prefill leg opened the room; the
    prefill side then reads the decode's acknowledgement on the same connection it watched for an
    abort while waiting. With a small unpaced KV nothing yields in between: the watch must be
    finished before that read, or the room is never handed over (the prefill leg failed after its
    bootstrap timeout while the decode leg had its KV)."""

    async def scenario() -> None:
        settings = DisaggSettings(mode="prefill", bootstrap_port=0, bootstrap_timeout_s=5.0)
        server = BootstrapServer(settings)
        port = await server.start("127.0.0.1")
        try:
            ids = [5, 6, 7]
            decode_settings = DisaggSettings(mode="decode", waiting_timeout_s=5.0)
            fetch = asyncio.create_task(fetch_kv("127.0.0.1", port, 77, "early", ids, decode_settings))
            # the decode leg connects and waits for a room not yet open
            deadline = time.monotonic() + 10
            while server.waiting_decodes == 0:
                assert time.monotonic() < deadline and not fetch.done()
                await asyncio.sleep(0.001)
            server.open(77, "early")
            server.publish(77, ids, 0, 9, [9])
            assert await server.handed_over(77) is None
            assert (await fetch).tokens == len(ids)
        finally:
            await server.aclose()

    asyncio.run(scenario())
