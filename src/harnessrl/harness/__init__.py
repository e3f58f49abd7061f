"""What a harness author uses: the Harness protocol and typed tools.

A harness is `async def run(task, llm) -> Outcome`, where `llm` is an `openai.AsyncOpenAI` bound to
one episode: the agent code is ordinary OpenAI-client code, trained unchanged.
"""

from collections.abc import Awaitable, Callable

import openai

from harnessrl.harness.tools import Toolbox, tool_schema
from harnessrl.types import Outcome, Task

Harness = Callable[[Task, openai.AsyncOpenAI], Awaitable[Outcome]]

__all__ = ["Harness", "Toolbox", "tool_schema"]
