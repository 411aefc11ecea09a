"""An OpenAI Agents SDK run (Agent + function_tool) against the server, through Responses and Chat Completions.

Each turn's cache hit rate (cached tokens / prompt tokens) is printed (`-s`);
every turn after the first must be served mostly from the cache: the SDK sends
the whole conversation back each turn, and the server splices its own turns'
ids back in.
"""

import asyncio

import openai
import pytest

from tests.server.conftest import API_KEY, PAGE_SIZE

agents = pytest.importorskip("agents")

pytestmark = [pytest.mark.model, pytest.mark.slow]


@agents.function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"It is sunny and 21 C in {city}."


def _model(kind: str, client: openai.AsyncOpenAI, name: str):
    if kind == "responses":
        return agents.OpenAIResponsesModel(model=name, openai_client=client)
    return agents.OpenAIChatCompletionsModel(model=name, openai_client=client)


@pytest.mark.parametrize("kind", ["responses", "chat_completions"])
def test_an_agent_calls_its_tool_and_answers_with_cache_hits(server, kind):
    agents.set_tracing_disabled(True)

    async def run():
        async with openai.AsyncOpenAI(base_url=server.api_url, api_key=API_KEY, max_retries=0, timeout=120) as client:
            agent = agents.Agent(
                name="weather", instructions=f"You answer weather questions ({kind} run).",
                tools=[get_weather], model=_model(kind, client, server.model),
                # Forced on the first turn (the default model is too small to choose a tool); the SDK then
                # resets tool_choice to auto, so the next turn may answer.
                model_settings=agents.ModelSettings(tool_choice="required", max_tokens=128, temperature=0))
            return await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=4)

    try:
        result = asyncio.run(run())
        responses = result.raw_responses
    except agents.exceptions.MaxTurnsExceeded as exceeded:  # the small model kept calling the tool
        responses = exceeded.run_data.raw_responses
    assert len(responses) >= 2
    first_call = [item for item in responses[0].output if getattr(item, "type", None) == "function_call"]
    assert first_call and first_call[0].name == "get_weather"
    rates = []
    for turn, response in enumerate(responses):
        usage = response.usage
        rates.append(usage.input_tokens_details.cached_tokens / usage.input_tokens)
        print(f"{kind} turn {turn}: prompt {usage.input_tokens}, cached {usage.input_tokens_details.cached_tokens}, "
              f"output {usage.output_tokens}, hit rate {rates[-1]:.2f}")
    for previous, response in zip(responses, responses[1:]):
        reusable = previous.usage.input_tokens + previous.usage.output_tokens - PAGE_SIZE
        assert response.usage.input_tokens_details.cached_tokens >= reusable
