"""The OpenAI Agents SDK chaining turns with previous_response_id (and a conversation) against serve."""

from __future__ import annotations

import asyncio

import openai
from agents import (
    Agent,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.support.servers import Server

from .conftest import API_KEY, MODEL

set_tracing_disabled(True)


@function_tool
def get_weather(city: str) -> str:
    """Get the current weather for a city."""
    return f"21 degrees and sunny in {city}"


def _agent(server: Server) -> Agent:
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    return Agent(
        name="weather",
        instructions="Use tools when they help.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        tools=[get_weather],
    )


def test_a_tool_loop_chained_by_previous_response_id(stored_server: Server, client: openai.OpenAI) -> None:
    async def main() -> None:
        agent = _agent(stored_server)
        # the SDK sends only the new items each turn and names the previous response
        result = await Runner.run(agent, "What's the weather in Paris?", auto_previous_response_id=True)
        responses = result.raw_responses
        assert len(responses) >= 2  # the call, then the answer after the tool's output
        assert any(item.type == "function_call" for item in responses[0].output)
        later = client.responses.retrieve(responses[-1].response_id)  # type: ignore[arg-type]
        assert later.previous_response_id == responses[-2].response_id
        items = client.responses.input_items.list(later.id).data
        assert [item.type for item in items] == ["function_call_output"]  # only what was new
        assert "21 degrees" in (items[0].output or "")  # type: ignore[union-attr,operator]
        follow = await Runner.run(agent, "And in Rome?", previous_response_id=result.last_response_id)
        assert follow.final_output
        chained = client.responses.retrieve(follow.raw_responses[0].response_id)  # type: ignore[arg-type]
        assert chained.previous_response_id == result.last_response_id

    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_run_in_a_conversation(stored_server: Server, client: openai.OpenAI) -> None:
    async def main() -> None:
        agent = _agent(stored_server)
        conv = client.conversations.create()
        await Runner.run(agent, "What's the weather in Paris?", conversation_id=conv.id)
        types = [item.type for item in client.conversations.items.list(conv.id, order="asc", limit=100).data]
        assert types[0] == "message" and "function_call" in types and "function_call_output" in types
        assert types[-1] == "message"

    asyncio.run(asyncio.wait_for(main(), 120))
