"""Why a search episode failed: one error class per episode, from what the agent saw and answered.

Classes, first match wins (`ERROR_CLASSES` in this order):

    ok               the answer is correct
    failed           the episode raised or timed out
    malformed_call   no answer, and at least one tool call could not be parsed
    no_answer        no answer (out of turns or budget), every call well formed
    gold_not_seen    answered before every gold document had entered the context
    wrong_field      the answer is other text of a gold document (the right entity, the wrong fact)
    wrong_entity     the answer is text of a document seen that is not gold (a distractor's fact)
    not_in_context   the answer is in no document seen (invented, garbled or cut short)

Text matching uses the answer check's normalisation (case, punctuation, spacing ignored) and whole words: "Bo" is
not in "born".
"""

from __future__ import annotations

from harnessrl.envs.search.data import Doc, normalise
from harnessrl.types import Episode

ERROR_CLASSES = ("ok", "failed", "malformed_call", "no_answer", "gold_not_seen", "wrong_field", "wrong_entity",
                 "not_in_context")  # fmt: skip


def error_class(episode: Episode, documents: dict[str, Doc]) -> str:
    outcome = episode.outcome
    if episode.status == "failed" or outcome is None:
        return "failed"
    if outcome.success:
        return "ok"
    info = outcome.info
    if not outcome.answer and not info.get("doc_ids"):
        return "malformed_call" if any(c.tool_call_error for c in episode.calls) else "no_answer"
    gold, seen = episode.task.data.get("gold_doc_ids", []), info.get("trajectory_doc_ids", [])
    if not set(gold) <= set(seen):
        return "gold_not_seen"
    answer = normalise(outcome.answer or "")

    def holds(doc_id: str) -> bool:
        doc = documents.get(doc_id)
        text = normalise(f"{doc.title or ''} {doc.text}") if doc is not None else ""
        return bool(answer) and f" {answer} " in f" {text} "

    if any(holds(d) for d in gold):
        return "wrong_field"
    if any(holds(d) for d in seen if d not in gold):
        return "wrong_entity"
    return "not_in_context"
