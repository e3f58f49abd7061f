"""Agentic search over an embedded Chroma index (the Context-1 pattern)."""

from harnessrl.envs.search.data import Doc, SearchTask, load, synthetic, write_corpus
from harnessrl.envs.search.harness import SearchAgent
from harnessrl.envs.search.index import SearchIndex
from harnessrl.envs.search.reward import context1_reward
from harnessrl.envs.search.voyages import voyages

GENERATORS = {"people": synthetic, "voyages": voyages}  # synthetic corpora `harnessrl make-corpus` writes

__all__ = ["GENERATORS", "Doc", "SearchAgent", "SearchIndex", "SearchTask", "context1_reward", "load", "synthetic",
           "voyages", "write_corpus"]  # fmt: skip
