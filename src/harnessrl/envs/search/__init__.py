"""Agentic search over an embedded Chroma index (the Context-1 pattern)."""

from harnessrl.envs.search.data import Doc, SearchTask, load, synthetic
from harnessrl.envs.search.harness import SearchAgent
from harnessrl.envs.search.index import SearchIndex
from harnessrl.envs.search.reward import context1_reward

__all__ = ["Doc", "SearchAgent", "SearchIndex", "SearchTask", "context1_reward", "load", "synthetic"]
