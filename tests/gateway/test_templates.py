"""Token reuse under chat templates other than tiny's own: glue before the end-of-turn, assistant content trimmed,
and a template that raises."""

import pytest

from harnessrl.gateway import GatewayClient, create_app
from harnessrl.policy import Policy
from harnessrl.policy.tiny import build_tiny
from tests.conftest import ADMIN_KEY

# ChatML that ends an assistant turn with a newline before <|im_end|> (several real templates do)
NEWLINE_BEFORE_END = (
    "{%- for message in messages -%}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{{ '\\n' if message.role == 'assistant' }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)
# ChatML that trims assistant content (Llama 3.x and Gemma templates render `content | trim`)
TRIMS_REPLIES = (
    "{%- for message in messages -%}<|im_start|>{{ message.role }}\n"
    "{{ message.content | trim if message.role == 'assistant' else message.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)
# ChatML that renders prompts only: it refuses a conversation that ends on an assistant turn (the gateway renders
# one, its stand-in turn, to find where a turn ends)
REFUSES_A_LAST_ASSISTANT_TURN = (
    "{%- if messages[-1].role == 'assistant' %}{{ raise_exception('prompts only') }}{% endif -%}"
    "{%- for message in messages -%}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


@pytest.fixture
async def gateway_with(request):
    """A gateway over tiny with the chat template the test is parametrized with."""
    model, tokenizer = build_tiny(seed=0)
    tokenizer.chat_template = request.param
    policy = Policy(model, tokenizer, "tiny-variant")
    client = GatewayClient(ADMIN_KEY, app=create_app(policy, ADMIN_KEY))
    yield policy, client
    await client.aclose()
    policy.close()


@pytest.mark.parametrize("gateway_with", [NEWLINE_BEFORE_END], indirect=True)
async def test_text_before_the_end_of_turn_is_not_repeated_after_a_sampled_end_of_turn(gateway_with):
    policy, gateway = gateway_with
    episode_id, key = await gateway.create_episode()
    llm = gateway.openai(key)
    question = [{"role": "user", "content": "Weather?"}]
    reply = {"role": "assistant", "content": "It is sunny."}
    await llm.post("/demonstrations", cast_to=object, body={"messages": question, "reply": reply})
    follow_up = [*question, reply, {"role": "user", "content": "And tomorrow?"}]
    await llm.chat.completions.create(model="tiny", messages=follow_up, max_tokens=2)
    first, second = (await gateway.episode(episode_id)).calls
    assert policy.decode(first.completion_ids) == "It is sunny.\n<|im_end|>"  # ends on the end-of-turn token
    assert second.extends_call == 0 and second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    # what follows the end-of-turn is the template's "\n<|im_start|>user ...", not a second "\n<|im_end|>"
    assert second.prompt_ids == policy.encode(policy.render(follow_up, None, generation_prompt=True))


async def _two_turns(gateway):
    """The calls of a conversation of two turns (a question, then a follow-up carrying the first reply), and the
    follow-up's messages."""
    episode_id, key = await gateway.create_episode()
    llm = gateway.openai(key)
    question = [{"role": "user", "content": "Weather?"}]
    r = await llm.chat.completions.create(model="tiny", messages=question, max_tokens=6, seed=1)
    reply = {"role": "assistant", "content": r.choices[0].message.content}
    follow_up = [*question, reply, {"role": "user", "content": "ok"}]
    await llm.chat.completions.create(model="tiny", messages=follow_up, max_tokens=2, seed=2)
    return (await gateway.episode(episode_id)).calls, follow_up


@pytest.mark.parametrize("gateway_with", [TRIMS_REPLIES], indirect=True)
async def test_a_template_that_trims_replies_still_extends_the_earlier_call(gateway_with):
    """The stand-in turn holds no character that `trim` strips (a control character would be): it keeps its ends
    under `content | trim`, so the next turn still extends the call token-exactly."""
    (first, second), _ = await _two_turns(gateway_with[1])
    assert second.extends_call == 0
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)]
        == first.prompt_ids + first.completion_ids
    )


@pytest.mark.parametrize("gateway_with", [REFUSES_A_LAST_ASSISTANT_TURN], indirect=True)
async def test_a_template_that_raises_on_extension_starts_a_new_sequence(gateway_with):
    policy, gateway = gateway_with
    (first, second), follow_up = await _two_turns(gateway)  # the second a 200, not a 500
    assert second.extends_call is None  # a fresh render, never a silent misalignment
    assert second.prompt_ids == policy.encode(policy.render(follow_up, None, generation_prompt=True))
