"""The production loop: trace store, feedback reward, model registry, training cycle with an eval gate, ingest.

serve (gateway + store + registry) -> users' feedback -> `cycle` (reward from feedback, train a
candidate, paired eval gate with canaries) -> promote or refuse -> `promote` / `rollback` by hand.
"""

from harnessrl.loop.store import Store

__all__ = ["Store"]
