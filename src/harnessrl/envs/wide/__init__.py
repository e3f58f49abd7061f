"""Wide research (WideSearch-style): "answer each of these N questions", by a trainable orchestrator
that hands the questions to frozen search sub-agents, or by one search agent doing them in turn."""

from harnessrl.envs.wide.expert import OrchestratorExpert, demonstrate
from harnessrl.envs.wide.harness import SerialSearch, WideOrchestrator, search_subagent
from harnessrl.envs.wide.reward import item_f1, wide_reward
from harnessrl.envs.wide.tasks import wide_tasks

__all__ = ["OrchestratorExpert", "SerialSearch", "WideOrchestrator", "demonstrate", "item_f1", "search_subagent",
           "wide_reward", "wide_tasks"]  # fmt: skip
