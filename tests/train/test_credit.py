"""Credit in a swarm: frozen sub-agent tokens carry no loss (bit-identical loss and gradient when their
logprobs change), and with role credit every role group is the task's episodes' lineages of that role."""

import copy

import pytest
import torch

from harnessrl.policy import Policy
from harnessrl.train import TrainConfig, Trainer
from harnessrl.train.advantages import group_advantages
from harnessrl.train.credit import credited_sequences, role_groups
from harnessrl.types import Call
from tests.train.helpers import sampled_groups


@pytest.fixture(scope="module")
def policy():
    p = Policy.load("tiny")
    yield p
    p.close()


def _with_sub_agents(groups, runs_of, trainable: bool):
    """Each episode gets `runs_of(i)` sub-agent runs of role "scout" (copies of its sampled call, with its own prompt)."""
    groups = copy.deepcopy(groups)
    for group in groups:
        for i, episode in enumerate(group):
            base = episode.calls[0]
            for run in range(runs_of(i)):
                episode.calls.append(Call(**{
                    **base.model_dump(), "agent": "scout", "lineage": f"scout/{run}", "parent_call": 0,
                    "trainable": trainable, "model": None if trainable else "frozen", "prompt_ids": [run + 1, *base.prompt_ids],
                }))  # fmt: skip
    return groups


def _step(policy, groups) -> tuple[float, list[torch.Tensor]]:
    trainer = Trainer(policy.model, policy.tokenizer, TrainConfig(lr=1e-3, seed=0))
    metrics = trainer.rl_step(groups)
    return metrics["loss/policy"], [p.grad.clone() for p in trainer.params]


def test_frozen_sub_agent_tokens_carry_no_loss(policy):
    groups = _with_sub_agents(sampled_groups(policy, groups=2, size=4), lambda i: 2, trainable=False)
    loss, grads = _step(policy, groups)
    perturbed = copy.deepcopy(groups)
    for episode in (e for g in perturbed for e in g):
        for call in episode.calls[1:]:
            call.sampled_logprobs = [lp - 3.0 for lp in call.sampled_logprobs]
    loss2, grads2 = _step(policy, perturbed)
    assert loss == loss2 and all(torch.equal(a, b) for a, b in zip(grads, grads2))
    # the check can fail: the same perturbation on the trainable calls moves the loss
    for episode in (e for g in perturbed for e in g):
        episode.calls[0].sampled_logprobs = [lp - 0.5 for lp in episode.calls[0].sampled_logprobs]
    assert _step(policy, perturbed)[0] != loss


def test_role_credit_groups_each_role_across_the_task_and_drops_roles_of_one_episode(policy):
    (group,) = _with_sub_agents(sampled_groups(policy, groups=1, size=4), lambda i: i % 3, trainable=True)
    group[1].calls.append(group[1].calls[0].model_copy(update={"agent": "solo", "lineage": "solo/0", "parent_call": 0,
                                                               "prompt_ids": [9, *group[1].calls[0].prompt_ids]}))  # fmt: skip
    for k in range(2):  # a role with two lineages, both in one episode: one reward, nothing to compare
        group[3].calls.append(group[3].calls[0].model_copy(update={"agent": "duo", "lineage": f"duo/{k}", "parent_call": 0,
                                                                   "prompt_ids": [7 + k, *group[3].calls[0].prompt_ids]}))  # fmt: skip
    scores = [e.reward.total for e in group]
    roles = role_groups(group, scores)
    assert {role: len(members) for role, members in roles.items()} == {
        "main": 4,
        "scout": 0 + 1 + 2 + 0,
        "solo": 1,
        "duo": 2,
    }
    sequences, dropped = credited_sequences(group, scores, "grpo", credit="role")
    assert dropped == 2 and len(sequences) == 4 + 3
    main = [s.advantage for s in sequences if s.lineage == "main"]
    assert main == pytest.approx(group_advantages(scores))  # the orchestrator's group is the episode group
    scout = [s.advantage for s in sequences if s.lineage.startswith("scout")]
    assert scout == pytest.approx(group_advantages([scores[1], scores[2], scores[2]]))
    # episode credit: every trainable sequence carries its episode's advantage
    shared, _ = credited_sequences(group, scores, "grpo")
    assert len(shared) == 4 + 3 + 1 + 2
