"""The simulated engine reads an agent's follow-up from where the conversation's previous request
left off (engines/sim/turn_memo.py) and sees exactly what reading the whole prompt sees: the same
view of tools and results, the same cached prefix."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from typing import Any

from deepseek_frontend.engines.sim.engine import PrefixCache, SimulatedEngine, prompt_bytes
from deepseek_frontend.engines.sim.model import SHORT_ANSWER_WORDS, USER_TURN, answer_is_short, read_prompt
from deepseek_frontend.engines.sim.prompts import SimPrompt
from deepseek_frontend.formats import attach_request_tools, get_chat_format

from .conftest import TOOLS, bundled_tokenizer, request_for


def _agent_prompts(turns: int, salt: str, family: str = "deepseek_v4") -> list[list[int]]:
    """The prompts of one agent conversation: each turn's tool call and result appended, resent whole."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"{salt}: find the weather in three cities"}
    ]
    prompts = []
    for turn in range(turns):
        rendered = get_chat_format(family).encode_messages(
            attach_request_tools(messages, TOOLS), thinking_mode="chat"
        )
        prompts.append(bundled_tokenizer().encode_raw(rendered))
        call = {"name": "get_weather", "arguments": json.dumps({"location": f"city {turn}"})}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"c{turn}", "type": "function", "function": call}],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"c{turn}",
                "content": f"{salt} result {turn}: " + "sunny " * 40 * (turn + 1),
            }
        )
    return prompts


def test_follow_ups_read_from_the_memo_see_what_the_whole_prompt_shows(monkeypatch: Any) -> None:
    from deepseek_frontend.engines.sim import engine as sim_engine

    extended: list[int] = []
    extend = sim_engine.extend_head
    monkeypatch.setattr(
        sim_engine, "extend_head", lambda head, text: extended.append(1) or extend(head, text)
    )
    tokenizer = bundled_tokenizer()
    engine = SimulatedEngine(tokenizer, page_size=16)
    user_id = tokenizer.encode_raw(USER_TURN)[0]
    heads: set[int] = set()
    for family in ("deepseek_v4", "deepseek_v32"):
        for conversation in ("alpha", "beta"):
            for ids in _agent_prompts(5, f"{family} {conversation}", family):
                expected = read_prompt(tokenizer.decode(ids, skip_special_tokens=False))
                assert engine._read(ids, prompt_bytes(ids)) == expected
            users = [at for at, token in enumerate(ids) if token == user_id]
            # what stays: the head all conversations of a family share (before the first user
            # turn) and each conversation's newest, not one entry per turn
            heads |= {users[0], users[-1]}
    # every V4 follow-up's head was decoded from the remembered head of the turn before (V3.2 keeps
    # a loop's results in the user turn that started it: its head does not change, the head memo has it)
    assert engine._head_texts.hits == 2 * 4
    assert {count for count, _ in engine._head_texts._entries} == heads
    # and its tools were read from the text after that head only (extend_head)
    assert len(extended) == 2 * 4


def test_a_head_read_on_from_a_shorter_one_declares_what_reading_it_whole_declares() -> None:
    """``extend_head`` gives :func:`read_head`'s answer for any text that starts with the one read
    before -- also when a schema line is cut where the shorter text ends, or its last line is one."""
    from deepseek_frontend.engines.sim.model import extend_head, read_head

    rng = random.Random(7)
    pieces = [
        '{"name": "read_file", "parameters": {"type": "object"}}',
        '{"name": "grep", "parameters": {"properties": {"q": {"type": "string"}}}}',
        '{"name": "broken", ',
        "plain words about the task",
        "<｜User｜>run the tests",
        "<｜DSML｜function_calls>",
        'You MUST strictly adhere to the following schema to reply:\n{"type": "object"}',
        "",
    ]
    for _ in range(400):
        text = "\n".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.5:
            text += rng.choice(pieces)[: rng.randint(0, 30)]  # a line that goes on past the cut
        cut = rng.randint(0, len(text))
        head = extend_head(read_head(text[:cut]), text)
        assert head == read_head(text), (text[:cut], text[cut:])


def test_follow_ups_get_the_cached_prefix_the_whole_prompt_gets() -> None:
    tokenizer = bundled_tokenizer()
    engine = SimulatedEngine(tokenizer, page_size=16)
    plain = PrefixCache(page_size=16)
    for conversation in ("alpha", "beta"):
        for ids in _agent_prompts(6, conversation):
            prompt = SimPrompt.of(ids)
            expected = plain.lookup_and_insert(ids)
            assert engine._cached_prefix(ids, prompt) == expected
            fresh = SimPrompt.of(ids)
            PrefixCache(page_size=16).lookup_and_insert(ids, prompt=fresh)
            assert prompt.chains == fresh.chains  # the remembered hashes are the pages' own
    assert engine._page_chains.hits == 2 * 5  # every follow-up started from the turn before's hashes
    # one entry per conversation, its newest request's, and the head both start with
    assert len(engine._page_chains._entries) == 3


def test_the_memo_keeps_within_its_count_and_its_budget() -> None:
    from deepseek_frontend.engines.sim.turn_memo import TURN_MEMO_SIZE, HeadTexts

    texts = HeadTexts(budget=1000)
    data = bytes(range(256)) * 40
    for count in range(1, 300):
        texts.remember(data, count, "x" * 7)
    assert len(texts._entries) == min(TURN_MEMO_SIZE, 1000 // 7)
    assert texts.size == 7 * len(texts._entries) <= 1000
    texts.remember(data, 5, "y" * 2000)  # longer than the whole budget: not kept
    assert texts.size <= 1000 and all(len(v) == 7 for v in texts._entries.values())


def test_conversations_whose_heads_are_equally_long_each_find_their_own() -> None:
    """Agents' conversations often reach a turn at the same length in ids: each keeps its own entry."""
    from deepseek_frontend.engines.sim.turn_memo import HeadTexts

    texts = HeadTexts()
    first, second = bytes(range(256)) * 8, bytes(reversed(range(256))) * 8
    texts.remember(first, 100, "first head")
    texts.remember(second, 100, "second head")
    assert texts.longest(first, iter([300, 100])) == 100 == texts.longest(second, iter([300, 100]))
    assert texts.take(second, iter([300, 100, 10])) == (100, "second head")
    assert texts.take(first, iter([300, 100, 10])) == (100, "first head")
    assert texts.size == 0 and not texts._entries  # taken: each follow-up remembers its own head next
    assert texts.longest(bytes(2048), iter([100])) is None


def _output(engine: SimulatedEngine, ids: list[int], rid: str) -> list[int]:
    async def collect() -> list[int]:
        return [
            t async for chunk in engine.run(request_for(ids, rid, max_new_tokens=64)) for t in chunk.token_ids
        ]

    return asyncio.run(collect())


def test_a_follow_up_is_planned_in_its_own_step_and_a_first_turn_on_the_planning_thread() -> None:
    """An agent's follow-up (its head remembered from the turn before, a short answer) is planned in
    the request's own step, without two hops to the planning thread; a new conversation's first
    turn, read whole, is planned there. Either way the answer is the one the thread writes."""
    tokenizer = bundled_tokenizer()
    engine = SimulatedEngine(tokenizer, page_size=16)
    threaded = SimulatedEngine(tokenizer, page_size=16)
    threaded._cheap_plan_view = lambda request, prompt: None  # type: ignore[method-assign]
    planned_on: list[str] = []
    planned = engine._planned

    def recording(*args: Any) -> Any:
        planned_on.append(threading.current_thread().name)
        return planned(*args)

    engine._planned = recording  # type: ignore[method-assign]
    for turn, ids in enumerate(_agent_prompts(4, "inline")):
        assert _output(engine, ids, f"r{turn}") == _output(threaded, ids, f"t{turn}")
    here = threading.current_thread().name
    assert planned_on[0] != here and planned_on[0].startswith("sim-plan")
    assert planned_on[1:] == [here] * 3


def test_only_a_short_text_answer_is_written_on_the_loop() -> None:
    """A long answer ("write N words" past SHORT_ANSWER_WORDS) or tool calls (arguments from the
    schemas) may be long to write: those stay on the planning thread."""
    tokenizer = bundled_tokenizer()
    fmt = get_chat_format("deepseek_v4")

    def view(text: str, tools: bool = False) -> Any:
        messages = [{"role": "user", "content": text}]
        rendered = fmt.encode_messages(
            attach_request_tools(messages, TOOLS) if tools else messages, thinking_mode="chat"
        )
        return read_prompt(tokenizer.decode(tokenizer.encode_raw(rendered), skip_special_tokens=False))

    assert answer_is_short(view("what is the capital of France?"))
    assert answer_is_short(view(f"write {SHORT_ANSWER_WORDS} words about rivers"))
    assert not answer_is_short(view(f"write {SHORT_ANSWER_WORDS + 1} words about rivers"))
    assert not answer_is_short(view("find the weather in Paris with get_weather", tools=True))


def test_a_follow_up_bringing_tool_results_is_planned_from_its_last_turn_alone() -> None:
    """An agent's follow-up whose last turn brings tool results is answered from that turn: the
    history before it is not decoded, and the output is the one reading the whole prompt gives."""
    tokenizer = bundled_tokenizer()
    engine = SimulatedEngine(tokenizer, page_size=16)
    reference = SimulatedEngine(tokenizer, page_size=16)
    # the reference reads every prompt whole, on its planning thread
    reference._cheap_plan_view = lambda request, prompt: None  # type: ignore[method-assign]
    read = reference._read
    reference._read = lambda ids, data, whole=True: read(ids, data)  # type: ignore[method-assign]
    decoded: list[int] = []
    decode = engine._decode_with_specials

    def counting(ids: Any) -> str:
        decoded.append(len(ids))
        return decode(ids)

    engine._decode_with_specials = counting  # type: ignore[method-assign]
    user_id = tokenizer.encode_raw(USER_TURN)[0]
    follow_ups = 0
    for family in ("deepseek_v4", "deepseek_v32"):
        for turn, ids in enumerate(_agent_prompts(4, f"{family} results", family)):
            decoded.clear()
            assert _output(engine, ids, f"{family}-{turn}") == _output(reference, ids, f"{family}-ref-{turn}")
            if turn:
                follow_ups += 1
                last = max(at for at, token in enumerate(ids) if token == user_id)
                assert decoded == [len(ids) - last - 1]  # the last turn, and nothing before it
    assert follow_ups == 6
    assert engine._head_texts.hits == 0 and len(engine._heads) == 2  # only the first turns' heads


def test_an_answer_that_reads_the_head_is_told_apart_from_one_that_does_not() -> None:
    """``answer_reads_head`` is False only where the plan from the turn alone is the plan from the
    whole prompt: every combination of these heads and turns, and every seed tried, plans the same
    either way when it says so, and it says so for turns with tool results only."""
    from deepseek_frontend.engines.sim.model import (
        NO_HEAD,
        answer_reads_head,
        plan_output,
        read_head,
        read_last_turn,
    )

    def head_of(family: str, tools: bool) -> str:
        messages = [{"role": "user", "content": "start"}]
        rendered = get_chat_format(family).encode_messages(
            attach_request_tools(messages, TOOLS) if tools else messages, thinking_mode="chat"
        )
        return rendered[: rendered.rfind(USER_TURN)]

    schema = '{"type": "object", "properties": {"city": {"type": "string"}}}'
    heads = [
        read_head(head_of("deepseek_v4", True)),
        read_head(head_of("deepseek_v32", True)),
        read_head(head_of("deepseek_v4", False)),
        read_head("You MUST strictly adhere to the following schema to reply:\n" + schema + "\n"),
        # a tool search tool: its rule calls it for a tool-like word a fresh user turn names
        read_head('{"name": "ToolSearch", "parameters": {"properties": {"query": {"type": "string"}}}}\n'),
    ]
    users = [
        "what is the weather in Paris?",
        "use the tool get_weather for Paris",
        "look up FooBarBaz with web_search",
        f"write {SHORT_ANSWER_WORDS * 3} words about rivers",
        "reply with exactly: done",
    ]
    results = [
        "<tool_result>sunny, 21 degrees in Paris</tool_result>",
        '<tool_result>{"name": "get_time", "parameters": {"type": "object"}}</tool_result>',
        "<function_results><result>ok: 3 files</result></function_results>",
        "<tool_result></tool_result>",
    ]
    calls = "<｜Assistant｜></think><｜DSML｜tool_calls>call</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
    endings = ["<｜Assistant｜></think>", "<｜Assistant｜><think>", "<｜Assistant｜><｜DSML｜tool_calls>\n"]
    rng = random.Random(11)
    alone = differs = 0
    for _ in range(600):
        turn = rng.choice(users)
        for _ in range(rng.randint(0, 2)):
            turn += calls + rng.choice(results)
        turn += rng.choice(endings)
        head = rng.choice(heads)
        seed = rng.randrange(1000)
        whole = plan_output(read_last_turn(head, turn), seed=seed)
        bare = plan_output(read_last_turn(NO_HEAD, turn), seed=seed)
        if not answer_reads_head(turn):
            alone += 1
            assert "<tool_result>" in turn or "<function_results>" in turn
            assert bare == whole, (head, turn)
        elif bare != whole:
            differs += 1
    # both kinds were tried, and the head does change answers the rule keeps reading it for
    assert alone > 100 and differs > 50
