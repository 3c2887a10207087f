"""The SGLang wire contract, checked with SGLang's own code.

SGLang 0.5.23 ships its HTTP JSON contract as generated code, ``sglang/api/v1/api_types.py``
(``GenerateRequest``, ``GenerateResponse``, ``GenerateStreamError``; ``/generate`` answers 400 to a
body its ``GenerateRequest`` decoder rejects, e.g. an unknown ``sampling_params`` field). The wheel is
a test-only dependency installed without its dependencies (``pip install --no-deps sglang==0.5.23``);
the module needs only ``msgspec``, so it is loaded from its file without running ``sglang/__init__``
(which imports numpy, torch, ...).

Every ``/generate`` body the SGLangClient sends is decoded as a ``GenerateRequest``; every chunk the
simulated engine server writes -- streamed or not, incremental or cumulative, with logprobs, finishing
by stop, length or abort, refusing like SGLang, failing by fault -- as a ``GenerateResponse`` or a
``GenerateStreamError``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from deepseek_frontend.engines.base import DecodingConstraint
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.engines.sim.behavior import PRESETS, SimBehavior
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.server import SGLANG_SAMPLING_FIELDS, SimFaults, build_sim_app

from .conftest import TOOLS, collect, prompt_ids, request_for, serve_app

SGLANG_VERSION = "0.5.23"


def load_api_types() -> ModuleType:
    """``sglang/api/v1/api_types.py`` of the installed wheel, without importing the ``sglang`` package."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"the SGLang wheel is missing: pip install --no-deps sglang=={SGLANG_VERSION}")
    root = Path(next(iter(spec.submodule_search_locations)))
    version = importlib.metadata.version("sglang")
    assert version == SGLANG_VERSION, f"expected sglang {SGLANG_VERSION}, found {version}"
    path = root / "api" / "v1" / "api_types.py"
    module_spec = importlib.util.spec_from_file_location("sglang_api_v1_types", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # msgspec resolves the annotations through sys.modules
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def api() -> ModuleType:
    return load_api_types()


def decode_event(api: ModuleType, data: bytes) -> Any:
    """One SSE ``data`` payload as SGLang's client would read it: a response chunk or a stream error."""
    value = orjson.loads(data)
    if "error" in value:
        decoded = api.GenerateStreamError.from_json_value(value)
        assert decoded.error is not None and decoded.error.message
        return decoded
    decoded = api.GenerateResponse.from_json_value(value)
    assert decoded.meta_info is not None and decoded.output_ids is not None
    return decoded


def sse_payloads(body: bytes) -> list[bytes]:
    lines = [line[5:].strip() for line in body.split(b"\n") if line.startswith(b"data:")]
    assert lines and lines[-1] == b"[DONE]", body[-200:]
    return lines[:-1]


# ---------------------------------------------------------------- what the client sends


SAMPLINGS: list[dict[str, Any]] = [
    {},
    {"seed": 7, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05},
    {"frequency_penalty": 0.5, "presence_penalty": 0.25, "repetition_penalty": 1.1},
    {"logprobs": True, "top_logprobs": 5},
    {"ignore_eos": True, "min_new_tokens": 3},
    {"constraint": DecodingConstraint("ebnf", 'root ::= "x"')},
    {"constraint": DecodingConstraint("json_schema", '{"type": "object"}')},
    {"constraint": DecodingConstraint("regex", "[a-z]+")},
    {"constraint": DecodingConstraint("structural_tag", '{"type": "structural_tag"}')},
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: ",".join(s) or "defaults")
def test_every_generate_body_the_client_sends_is_a_valid_sglang_generate_request(
    api: ModuleType, sampling: dict[str, Any]
) -> None:
    seen: list[bytes] = []

    async def generate(request: Request) -> Response:
        seen.append(await request.body())

        async def events() -> Any:
            meta = {"id": "r", "finish_reason": {"type": "length", "length": 1}, "prompt_tokens": 3,
                    "completion_tokens": 1, "cached_tokens": 0}  # fmt: skip
            yield b"data: " + orjson.dumps({"output_ids": [5], "meta_info": meta}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def scenario() -> None:
        async with serve_app(Starlette(routes=[Route("/generate", generate, methods=["POST"])])) as url:
            client = SGLangClient(url)
            try:
                await collect(client, request_for([1, 2, 3], rid="contract-1", max_new_tokens=9, **sampling))
            finally:
                await client.aclose()

    asyncio.run(scenario())
    (raw,) = seen
    decoded = api.GenerateRequest.from_json_value(orjson.loads(raw))
    assert decoded.input_ids == [1, 2, 3] and decoded.rid == "contract-1~" and decoded.stream is True
    params = decoded.sampling_params
    assert params.max_new_tokens == 9 and params.skip_special_tokens is False
    constraint = sampling.get("constraint")
    if constraint is not None:
        assert getattr(params, constraint.kind) == constraint.value
    if "seed" in sampling:
        assert params.sampling_seed == sampling["seed"]
    if sampling.get("logprobs"):
        assert decoded.return_logprob is True and decoded.top_logprobs_num == sampling["top_logprobs"]


def test_sglang_rejects_a_body_with_an_unknown_sampling_field_and_so_does_the_sim(
    api: ModuleType, prompt_tokenizer: Any
) -> None:
    """The sim server knows exactly SGLang's sampling_params fields (SGLang answers 400 to others)."""
    assert frozenset(api.SamplingParams.__struct_fields__) == SGLANG_SAMPLING_FIELDS
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "detokenize": False}}
    with pytest.raises(api.JsonContractError, match="unknown field `detokenize`"):
        api.GenerateRequest.from_json_value(body)

    async def scenario() -> httpx.Response:
        async with (
            serve_app(build_sim_app(SimulatedEngine(prompt_tokenizer))) as url,
            httpx.AsyncClient() as http,
        ):
            return await http.post(url + "/generate", json=body)

    response = asyncio.run(scenario())
    assert response.status_code == 400 and "unknown field `detokenize`" in response.json()["error"]


# ---------------------------------------------------------------- what the simulated engine writes


def sim_bodies(
    prompt_tokenizer: Any,
    bodies: list[dict[str, Any]],
    *,
    cumulative: bool = False,
    behavior: SimBehavior | None = None,
    faults: SimFaults | None = None,
) -> list[httpx.Response]:
    async def scenario() -> list[httpx.Response]:
        app = build_sim_app(
            SimulatedEngine(prompt_tokenizer, tokens_per_chunk=2),
            cumulative=cumulative,
            behavior=behavior,
            faults=faults,
        )
        async with serve_app(app) as url, httpx.AsyncClient(timeout=30) as http:
            return [await http.post(url + "/generate", json=body) for body in bodies]

    return asyncio.run(scenario())


def generate_body(ids: list[int], *, stream: bool = True, **params: Any) -> dict[str, Any]:
    body = SGLangClient.request_body(request_for(ids, rid=f"sim-{len(ids)}", max_new_tokens=64))
    body["stream"] = stream
    body["sampling_params"].update(params)
    return body


@pytest.mark.parametrize("cumulative", [False, True], ids=["incremental", "cumulative"])
def test_every_chunk_the_sim_streams_is_a_valid_sglang_generate_response(
    api: ModuleType, prompt_tokenizer: Any, cumulative: bool
) -> None:
    chat = prompt_ids("Tell me about otters.", thinking=True)
    tools = prompt_ids("Weather in Paris?", tools=TOOLS, thinking=False)
    bodies = [
        generate_body(chat),  # finishes by EOS (stop)
        generate_body(chat, max_new_tokens=5),  # finishes by length
        generate_body(tools),
        {**generate_body(chat), "return_logprob": True, "top_logprobs_num": 3},
    ]
    responses = sim_bodies(prompt_tokenizer, bodies, cumulative=cumulative)
    finishes = []
    for response in responses:
        assert response.status_code == 200
        events = [decode_event(api, data) for data in sse_payloads(response.content)]
        assert all(isinstance(e, api.GenerateResponse) for e in events)
        finishes.append(type(events[-1].meta_info.finish_reason).__name__)
    assert finishes[:2] == ["FinishStop", "FinishLength"]


def test_a_non_streamed_sim_answer_is_a_valid_sglang_generate_response(
    api: ModuleType, prompt_tokenizer: Any
) -> None:
    (response,) = sim_bodies(prompt_tokenizer, [generate_body(prompt_ids("Hi"), stream=False)])
    decoded = api.GenerateResponse.from_json_value(response.json())
    assert decoded.output_ids and decoded.meta_info.completion_tokens == len(decoded.output_ids)


def test_the_sims_refusals_are_sglangs_abort_chunk_and_stream_error(
    api: ModuleType, prompt_tokenizer: Any
) -> None:
    recipe = PRESETS["sglang-recipe"].with_overrides(context_length=512)
    ids = prompt_ids("Hi", thinking=False)
    grammar_body = generate_body(ids, ebnf='root ::= "x"')
    too_long = generate_body(ids, max_new_tokens=512 - len(ids) - 3)  # 4 slots are reserved
    grammar_response, long_response = sim_bodies(prompt_tokenizer, [grammar_body, too_long], behavior=recipe)

    (abort,) = [decode_event(api, d) for d in sse_payloads(grammar_response.content)]
    reason = abort.meta_info.finish_reason
    assert isinstance(reason, api.FinishAbort) and reason.status_code == 400
    assert reason.err_type == "BadRequestError" and "--grammar-backend none" in (reason.message or "")

    (error,) = [decode_event(api, d) for d in sse_payloads(long_response.content)]
    assert isinstance(error, api.GenerateStreamError) and error.error.code == 400
    assert orjson.loads(sse_payloads(long_response.content)[0])["error"]["retryable"] is False


@pytest.mark.parametrize("fail_after", [0, 3])
def test_the_sims_fault_events_are_sglang_stream_errors(
    api: ModuleType, prompt_tokenizer: Any, fail_after: int
) -> None:
    (response,) = sim_bodies(
        prompt_tokenizer,
        [generate_body(prompt_ids("write 30 words"))],
        faults=SimFaults(fail_after, "error-event"),
    )
    payloads = [
        orjson.loads(d) for d in response.content.split(b"\n") if d.startswith(b"data:") for d in [d[5:]]
    ]
    events = [
        api.GenerateStreamError.from_json_value(p)
        if "error" in p
        else api.GenerateResponse.from_json_value(p)
        for p in payloads
    ]
    assert isinstance(events[-1], api.GenerateStreamError)
    assert sum(len(e.output_ids or []) for e in events[:-1]) == fail_after


def test_sglang_rejects_input_ids_that_are_not_ints_and_so_does_the_sim(
    api: ModuleType, prompt_tokenizer: Any
) -> None:
    """A token id that is not an int is a 400 from both (the sim checks it as it packs the ids)."""
    body = {"input_ids": [1, "two", 3], "sampling_params": {"max_new_tokens": 2}, "stream": True}
    with pytest.raises(api.JsonContractError):
        api.GenerateRequest.from_json_value(body)

    async def scenario() -> tuple[httpx.Response, int]:
        engine = SimulatedEngine(prompt_tokenizer)
        async with serve_app(build_sim_app(engine)) as url, httpx.AsyncClient() as http:
            return await http.post(url + "/generate", json=body), engine.stats.started

    response, started = asyncio.run(scenario())
    assert response.status_code == 400 and "input_ids must be" in response.text
    assert started == 0, "a refused request never starts"


def test_both_legs_of_a_disaggregated_request_are_valid_sglang_generate_requests(api: ModuleType) -> None:
    """The prefill/decode orchestrator (disagg/pool.py) sends SGLang's PD fields; SGLang's own decoder
    reads both legs' bodies, the bootstrap trio and the DP rank hints included, with the largest room."""
    from deepseek_frontend.disagg.parts import ROOM_LIMIT
    from deepseek_frontend.disagg.pool import DisaggregatedPool
    from deepseek_frontend.engines.pool import from_urls
    from deepseek_frontend.routing.router import Router
    from tests.disagg.fakes import TOKENS, FakeSGLangPd, Rendezvous

    bodies: list[dict[str, Any]] = []

    async def scenario() -> None:
        rv = Rendezvous()
        p, d = FakeSGLangPd("prefill", rv), FakeSGLangPd("decode", rv)
        await p.start()
        await d.start()
        pools = [from_urls("sglang", [f.url], health_interval_s=0, router=Router()) for f in (p, d)]
        pd = DisaggregatedPool(*pools)
        try:
            await pd.start()
            ids, _ = await collect(pd, request_for([1, 2, 3], rid="pd-1", max_new_tokens=5))  # type: ignore[arg-type]
            assert ids == TOKENS
            bodies.extend([p.bodies[0], d.bodies[0]])
            # the largest room and explicit rank hints, as a DP-attention deployment gets them
            pre, dec = pd.sglang_legs(request_for([1, 2, 3], rid="pd-2"), p.url, d.url, ROOM_LIMIT - 1)
            pre_fields = {**(pre.extra_fields or {}), "routed_dp_rank": 3, "disagg_prefill_dp_rank": 3}
            dec_fields = {**(dec.extra_fields or {}), "routed_dp_rank": 1, "disagg_prefill_dp_rank": 3}
            for leg, fields in ((pre, pre_fields), (dec, dec_fields)):
                bodies.append(SGLangClient.request_body(dataclasses.replace(leg, extra_fields=fields)))
        finally:
            await pd.aclose()
            await p.close()
            await d.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    prefill, decode, big_prefill, big_decode = (api.GenerateRequest.from_json_value(b) for b in bodies)
    for leg in (prefill, decode):
        assert leg.input_ids == [1, 2, 3] and leg.rid == "pd-1~" and leg.stream is True
        assert leg.bootstrap_host == "127.0.0.1" and leg.bootstrap_port == 8998
    assert prefill.bootstrap_room == decode.bootstrap_room and 0 <= prefill.bootstrap_room < ROOM_LIMIT
    assert big_prefill.bootstrap_room == big_decode.bootstrap_room == ROOM_LIMIT - 1
    assert big_prefill.routed_dp_rank == 3 and big_prefill.disagg_prefill_dp_rank == 3
    assert big_decode.routed_dp_rank == 1 and big_decode.disagg_prefill_dp_rank == 3
