"""A small scripted OpenAI-compatible judge served over real HTTP, for deterministic judge tests.

The `model` field picks the behaviour: `exact` scores 1 an answer containing "correct" and 0
otherwise; `biased` adds 0.3 to whichever answer comes first; `garbage` replies with prose; `slow`
sleeps past any short timeout; `flaky` fails every first attempt at a prompt with a 500. Malformed
replies: `duplicate_ids` scores answer 0 twice, `string_scores` writes "1", `bool_scores` writes true;
malformed completions: `no_choices` (`choices: []`), `not_json`; `null_usage` (`prompt_tokens: null`, which the judge tolerates).
Verdicts a judge should still read: `quoting` quotes an answer's JSON before the verdict, `null_reason` writes
`"reason": null`.
Refusals: `missing` answers 404 (a wrong model name), `rate_limited` 429. The last prompt is kept in `app.state.prompt`.
"""

from __future__ import annotations

import asyncio
import json
import re

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

_ANSWER = re.compile(r"<answer id=(\d+)>\n(.*?)\n</answer>", re.S)


def judge_app() -> FastAPI:
    app = FastAPI()
    seen: set[str] = set()
    app.state.requests = 0

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        app.state.requests += 1
        prompt, model = body["messages"][-1]["content"], body["model"]
        app.state.prompt = prompt
        if model in ("missing", "rate_limited"):
            status = 404 if model == "missing" else 429
            return JSONResponse({"error": {"message": model}}, status_code=status)
        if model == "slow":
            await asyncio.sleep(3)
        if model == "flaky" and prompt not in seen:
            seen.add(prompt)
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=500)
        answers = _ANSWER.findall(prompt)
        scores = [
            {"id": int(i), "score": 1.0 if "correct" in text and "incorrect" not in text else 0.0, "reason": "scripted"}
            for i, text in answers
        ]
        if model == "biased" and scores:
            scores[0]["score"] = min(1.0, scores[0]["score"] + 0.3)
        if model == "duplicate_ids":
            scores.append({**scores[0], "score": 1.0 - scores[0]["score"]})
        if model in ("string_scores", "bool_scores"):
            scores = [
                {**s, "score": str(int(s["score"])) if model == "string_scores" else bool(s["score"])} for s in scores
            ]
        if model == "null_reason":
            scores = [{**s, "reason": None} for s in scores]
        if model == "not_json":
            return PlainTextResponse("upstream busy")
        content = (
            "They all look fine to me." if model == "garbage" else "Here you go: " + json.dumps({"scores": scores})
        )
        if model == "quoting":
            content = 'Answer 0 returns {"city": "Paris"}, as asked. ' + content
        choices = [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(content.split()), "total_tokens": 0}
        return {
            "id": "judge-1", "object": "chat.completion", "created": 0, "model": model,
            "choices": [] if model == "no_choices" else choices,
            "usage": {**usage, "prompt_tokens": None} if model == "null_usage" else usage,
        }  # fmt: skip

    return app
