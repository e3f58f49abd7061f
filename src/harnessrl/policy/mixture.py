"""Procedural data for pretraining `tiny-base` and for probing any model on the same skills.

Every item draws fresh random names and values, so memorising cannot pay; only reading the context
can. Skills: `copy` (repeat a span), `recall` (a value from key-value lines or fact sentences),
`tool_args` (a `<tool_call>` whose arguments are copied from the conversation, tools drawn from a
varied pool of names and schemas), `record_field` (one field of one of several tool-result records,
given as JSON or as text lines, answered or passed on in a call), `question_call` (the user's
question passed word for word as a call's argument: "In which year" must not become "In which
country"), `entity_call` (the one name or code in a request passed to the tool its keyword names:
"What is the tide in Olmar?" -> get_tide(place="Olmar")), `list_calls` (one call per listed item,
in the list's order, each passing its item word for word: parallel calls over a list, sometimes
after a setup call and with an argument shared by every call), `record_chain` (a question naming links before
its field, "the f2 of the f1 of N": after each lookup's records, the next lookup with the name the link's field
holds, or at the chain's end the value; the question's wording says which), plus plain English prose. Any item can
be put behind a history of earlier answered copy / recall exchanges (`Mixture.history`, `with_history`):
an agent's long contexts. Nothing here knows any environment's corpus, templates or tasks.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field, replace
from functools import cache

from harnessrl.policy.tiny import prose_lines, tokenizer_text

SKILLS = ("copy", "recall", "tool_args", "record_field", "question_call", "entity_call", "list_calls", "record_chain")
_ONSETS = [
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "kr",
    "st",
    "th",
    "sh",
    "gl",
    "tr",
]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
_CODAS = ["", "", "n", "r", "l", "s", "k", "th", "m"]


@dataclass
class Item:
    skill: str
    messages: list[dict]  # ends with the user / tool turn the answer responds to
    answer: str  # the assistant's reply text
    tools: list[dict] | None = None
    expected_call: dict | list[dict] | None = field(default=None)  # tool answers: {"name", "arguments"} (or a list)
    # indices of earlier assistant turns in `messages` that are trained too (a drill's follow-up questions)
    trained: tuple[int, ...] = ()


@cache
def _words() -> list[str]:
    return sorted({w.lower() for w in re.findall(r"\b[A-Za-z]{3,10}\b", tokenizer_text())})


class Mixture:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.records = (2, 5)  # how many records a `record_field` item shows (pretraining ramps it up from 1)
        self.fields = (2, 4)  # and how many fields each record has
        self.follow_ups = 0  # up to this many more questions about the same records (pretraining; the probe asks one)
        self.history = (0, 0)  # earlier exchanges put before each item's question (pretraining's long contexts)

    # ---- values -------------------------------------------------------------------------------

    def name(self) -> str:
        syllables = self.rng.randint(2, 3)
        return "".join(
            self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS) for _ in range(syllables)
        ).capitalize()

    def word(self) -> str:
        return self.rng.choice(_words())

    def value(self) -> str:
        kind = self.rng.randrange(5)
        if kind == 0:
            return str(self.rng.randint(0, 10 ** self.rng.randint(1, 5)))
        if kind == 1:
            return f"{self.rng.randint(1500, 2030)}-{self.rng.randint(1, 12):02d}-{self.rng.randint(1, 28):02d}"
        if kind == 2:
            return self.name()
        if kind == 3:
            return f"{self.word()} {self.word()}"
        return f"{self.rng.choice('ABCDEFGHKLMNPRSTXZ')}{self.rng.randint(1, 99)}-{self.rng.randint(100, 999)}"

    def key(self) -> str:
        return self.rng.choice([self.name(), f"{self.word()}_{self.word()}", f"{self.word()} of {self.name()}"])

    # ---- skills -------------------------------------------------------------------------------

    def item(self, skill: str) -> Item:
        item = getattr(self, f"_{skill}")()
        count = self.rng.randint(*self.history) if self.history[1] else 0
        return with_history(item, [m for _ in range(count) for m in self.exchange()], trained=True)

    def exchange(self) -> list[dict]:
        """An earlier copy or recall exchange, answered: history whose names and values the item does not ask for."""
        earlier = getattr(self, f"_{self.rng.choice(['copy', 'recall'])}")()
        return [m for m in earlier.messages if m["role"] != "system"] + [
            {"role": "assistant", "content": earlier.answer}
        ]

    def _copy(self) -> Item:
        span = " ".join(self.rng.choice([self.name, self.word, self.value])() for _ in range(self.rng.randint(2, 8)))
        ask = self.rng.choice(
            ["Repeat exactly: {s}", "Copy this text: {s}", "Say back the following.\n{s}", "Echo: [{s}]"]
        )
        return Item("copy", [{"role": "user", "content": ask.format(s=span)}], span)

    def _recall(self) -> Item:
        pairs, size = {}, self.rng.randint(2, 10)
        while len(pairs) < size:
            pairs[self.key()] = self.value()
        target = self.rng.choice(list(pairs))
        if self.rng.random() < 0.5:
            lines = "\n".join(f"{k}: {v}" for k, v in pairs.items())
        else:
            verb = self.rng.choice(["is", "equals", "was recorded as", "is listed as"])
            lines = " ".join(f"The {k} {verb} {v}." for k, v in pairs.items())
        question = self.rng.choice(["What is {k}?", "Give the value of {k}.", "{k}?", "Which value goes with {k}?"])
        system = [{"role": "system", "content": "Answer with the value only."}] if self.rng.random() < 0.5 else []
        user = {"role": "user", "content": f"{lines}\n{question.format(k=target)}"}
        return Item("recall", system + [user], pairs[target])

    def _tool(self, max_params: int = 3) -> dict:
        params, size = {}, self.rng.randint(1, max_params)
        while len(params) < size:
            params[self.rng.choice([self.word(), f"{self.word()}_{self.word()}"])] = self.rng.choice(
                ["string", "integer"]
            )
        name = self.rng.choice([f"{self.word()}_{self.word()}", f"get_{self.word()}", f"{self.word()}"])
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{self.word().capitalize()} {self.word()} {self.word()}.",
                "parameters": {
                    "type": "object",
                    "properties": {p: {"type": t} for p, t in params.items()},
                    "required": list(params),
                },
            },
        }

    def _string_tool(self) -> tuple[dict, str]:
        """A tool with one string parameter, and that parameter's name."""
        tool = self._tool(max_params=1)
        param = next(iter(tool["function"]["parameters"]["properties"]))
        tool["function"]["parameters"]["properties"][param]["type"] = "string"
        return tool, param

    def _tool_args(self) -> Item:
        tools, size = {}, self.rng.randint(1, 4)
        while len(tools) < size:
            tool = self._tool()
            tools[tool["function"]["name"]] = tool
        chosen = self.rng.choice(list(tools.values()))["function"]
        args = {
            p: (str(self.rng.randint(0, 9999)) if spec["type"] == "integer" else self.value())
            for p, spec in chosen["parameters"]["properties"].items()
        }
        args = {p: int(v) if chosen["parameters"]["properties"][p]["type"] == "integer" else v for p, v in args.items()}
        told = ", ".join(f"{p} {v}" for p, v in args.items())
        ask = self.rng.choice(["Use {t} with {a}.", "Please call {t}: {a}.", "I need {t} for {a}.", "Run {t} ({a})."])
        call = {"name": chosen["name"], "arguments": args}
        return Item(
            "tool_args",
            [{"role": "user", "content": ask.format(t=chosen["name"], a=told)}],
            _call_text(call),
            list(tools.values()),
            call,
        )

    def _field_words(self) -> list[str]:
        fields, size = [], self.rng.randint(*self.fields)
        while len(fields) < size:
            candidate = self.word()
            if candidate not in fields and candidate not in ("id", "name"):
                fields.append(candidate)
        return fields

    def _record(self, fields: list[str], name: str | None = None) -> dict:
        return {"id": f"r{self.rng.randint(10, 999)}", "name": name or self.name(), **{f: self.value() for f in fields}}

    def _record_field(self) -> Item:
        fields = self._field_words()
        records = [self._record(fields) for _ in range(self.rng.randint(*self.records))]
        target, wanted = self.rng.choice(records), self.rng.choice(fields)
        turns = [
            {"role": "user", "content": f"What is the {wanted} of {target['name']}?"},
            *_looked_up({"name": "lookup", "arguments": {"query": target["name"]}}, self._records_text(records)),
        ]
        tool, param = (None, None) if self.rng.random() < 0.5 else self._string_tool()
        answer, call = _field_answer(turns[0], target[wanted], tool, param)
        trained = []
        # a drill (pretraining only; the probe asks one question): more questions on the same records
        for _ in range(self.rng.randint(0, self.follow_ups) if self.follow_ups else 0):
            trained.append(len(turns))
            turns.append({"role": "assistant", "content": answer})
            record, wanted = self.rng.choice(records), self.rng.choice(fields)
            ask = self.rng.choice(_FIELD_ASKS).format(f=wanted, n=record["name"])
            turns.append({"role": "user", "content": ask})
            answer, call = _field_answer(turns[-1], record[wanted], tool if self.rng.random() < 0.5 else None, param)
        return Item("record_field", turns, answer, [tool] if tool else None, call, tuple(trained))

    def _record_chain(self) -> Item:
        """A question that names a chain of 0-2 links before the field it asks ("the f2 of the f1 of N"). Each
        lookup's records hold the next link's name under the link's field, so the reply to each result is the
        next lookup (that name, word for word) or, at the chain's end, the value: the question's wording, not
        what the records happen to show, says which. The item stops at a random one of these replies; the
        earlier ones are trained too."""
        tool, param = self._string_tool()
        links = self.rng.choice([0, 1, 1, 2])
        names = [self.name() if self.rng.random() < 0.6 else f"{self.name()} {self.name()}"]
        asked, results = [], []
        for level in range(links + 1):
            fields = self._field_words()
            records = [self._record(fields) for _ in range(self.rng.randint(*self.records) - 1)]
            chain = self._record(fields, names[-1])
            records.insert(self.rng.randrange(len(records) + 1), chain)
            asked.append(self.rng.choice(fields))
            if level < links:
                chain[asked[-1]] = self.name()
                names.append(chain[asked[-1]])
            results.append(self._records_text(records))
        subject = names[0]
        for field_word in asked[:-1]:
            subject = self.rng.choice([f"the {field_word} of {subject}", f"{subject}'s {field_word}"])
        question = {"role": "user", "content": self.rng.choice(_FIELD_ASKS).format(f=asked[-1], n=subject)}
        passer, passed = (None, None) if self.rng.random() < 0.5 else self._string_tool()
        if passer and passer["function"]["name"] == tool["function"]["name"]:
            passer = passed = None
        final, final_call = _field_answer(question, chain[asked[-1]], passer, passed)
        lookups = [{"name": tool["function"]["name"], "arguments": {param: n}} for n in names]
        turns = [question, *_looked_up(lookups[0], results[0])]
        stop, trained = self.rng.randint(0, links), []
        for level in range(stop):  # the replies before the one asked: lookups of the next link, trained
            trained.append(len(turns))
            turns.append({"role": "assistant", "content": _call_text(lookups[level + 1])})
            turns.append({"role": "tool", "tool_call_id": f"c{level + 1}", "content": results[level + 1]})
        answer, call = (final, final_call) if stop == links else (_call_text(lookups[stop + 1]), lookups[stop + 1])
        return Item("record_chain", turns, answer, [tool] + ([passer] if passer else []), call, tuple(trained))

    def _records_text(self, records: list[dict]) -> str:
        """Records as a JSON list, or one `[id] name: field value; ...` line each."""
        if self.rng.random() < 0.5:
            return json.dumps(records, ensure_ascii=False)
        sep = self.rng.choice(["; ", ", ", " | "])
        return "\n".join(
            f"[{r['id']}] {r['name']}: " + sep.join(f"{k} {v}" for k, v in r.items() if k not in ("id", "name"))
            for r in records
        )

    def question(self) -> str:
        """A question in one of many shapes, its words and names drawn fresh."""
        w, n = self.word, self.name
        shape = self.rng.choice(_QUESTIONS)
        return shape.format(
            w1=w(),
            w2=w(),
            w3=w(),
            n=n() if self.rng.random() < 0.6 else f"{n()} {n()}",
            year=self.rng.randint(1500, 2030),
        )

    def _question_call(self) -> Item:
        tools = [self._tool() for _ in range(self.rng.randint(0, 3))]
        target, param = self._string_tool()
        tools.insert(self.rng.randrange(len(tools) + 1), target)
        name, question = target["function"]["name"], self.question()
        rule = self.rng.choice(_QUOTE_RULES).format(t=name, p=param)
        if self.rng.random() < 0.5:
            messages = [{"role": "system", "content": rule}, {"role": "user", "content": question}]
        else:
            messages = [{"role": "user", "content": f"{question}\n{rule}"}]
        call = {"name": name, "arguments": {param: question}}
        return Item("question_call", messages, _call_text(call), tools, call)

    def _entity_call(self) -> Item:
        """The one name (or code) in a request, passed to the tool its keyword points at."""
        keyword = self.word()
        target, param = self._string_tool()
        target["function"]["name"] = self.rng.choice(
            [f"get_{keyword}", keyword, f"{keyword}_lookup", f"find_{keyword}"]
        )
        tools = [
            t for t in (self._tool() for _ in range(self.rng.randint(0, 3))) if keyword not in t["function"]["name"]
        ]
        tools.insert(self.rng.randrange(len(tools) + 1), target)
        entity = self.rng.choice([self.name(), self.name(), f"{self.name()} {self.name()}", self.value()])
        ask = self.rng.choice(_ENTITY_ASKS).format(k=keyword, e=entity, w=self.word())
        call = {"name": target["function"]["name"], "arguments": {param: entity}}
        return Item("entity_call", [{"role": "user", "content": ask}], _call_text(call), tools, call)

    def _list_calls(self) -> Item:
        """One call per item of a listed batch, in the list's order, the item copied as an argument;
        sometimes with a second argument every call shares, sometimes after a setup call."""
        target, param = self._string_tool()
        name, spec = target["function"]["name"], target["function"]["parameters"]
        shared = self.rng.choice([None, self.word(), f"{self.word()}_{self.word()}"])
        if shared == param:
            shared = None
        if shared:  # the schema's order is the calls' order
            order = [shared, param] if self.rng.random() < 0.5 else [param, shared]
            spec["properties"], spec["required"] = {k: {"type": "string"} for k in order}, order
        tools = [t for t in (self._tool() for _ in range(self.rng.randint(0, 2))) if t["function"]["name"] != name]
        tools.insert(self.rng.randrange(len(tools) + 1), target)
        draw, size, items = self.rng.choice([self.question, self.name, self.value]), self.rng.randint(2, 8), []
        while len(items) < size:
            if (x := draw()) not in items:
                items.append(x)
        style = self.rng.randrange(3)
        if style == 0:
            listing = "\n".join(f"{i + 1}. {x}" for i, x in enumerate(items))
        else:  # a comma list only where items cannot hold commas. NB `draw is self.name` never holds (each access
            # makes a new bound method), so no list is a comma list: tiny-base (v5) was pretrained on this data, and
            # `==` would change it; kept until the next base is pretrained
            listing = ", ".join(items) if style == 2 and draw is self.name else "\n".join(f"- {x}" for x in items)
        ask, value = self.rng.choice(_LIST_ASKS).format(t=name, p=param), self.value()
        if shared:
            ask += f" Set {shared} to {value} in each."
        calls = []
        setup = self._tool()
        if self.rng.random() < 0.3 and setup["function"]["name"] not in {t["function"]["name"] for t in tools}:
            args = {k: self.rng.randint(0, 9999) if v["type"] == "integer" else self.value()
                    for k, v in setup["function"]["parameters"]["properties"].items()}  # fmt: skip
            told = ", ".join(f"{k} {v}" for k, v in args.items())
            ask = f"First call {setup['function']['name']} with {told}. Then: {ask}"
            tools.append(setup)
            calls.append({"name": setup["function"]["name"], "arguments": args})
        for x in items:
            given = {param: x, **({shared: value} if shared else {})}
            calls.append({"name": name, "arguments": {k: given[k] for k in spec["properties"]}})
        if self.rng.random() < 0.5:  # the instruction in the user turn, or as a rule in the system turn
            messages = [{"role": "user", "content": f"{ask}\n{listing}"}]
        else:
            lead = self.rng.choice(["", "Here they are:\n", f"{self.word().capitalize()} {self.word()}:\n"])
            messages = [{"role": "system", "content": ask}, {"role": "user", "content": lead + listing}]
        return Item("list_calls", messages, "".join(_call_text(c) for c in calls), tools, calls)

    def prose(self) -> str:
        lines = prose_lines()
        start = self.rng.randrange(len(lines))
        return " ".join(lines[start : start + self.rng.randint(3, 10)])


_QUESTIONS = [
    "In which {w1} was {n} {w2}?",
    "What {w1} did {n} {w2}?",
    "What is the {w1} of the {w2} where {n} {w3}?",
    "Who {w1} the {w2} of {n}?",
    "How many {w1} does {n} have?",
    "When did {n} {w1} the {w2}?",
    "Which {w1} is {n} known for?",
    "Where is the {w1} {w2} of {n}?",
    "Was {n} a {w1} or a {w2}?",
    "What {w1} grows near {n}?",
    "In what {w1} did {n} {w2} in {year}?",
    "Name the {w1} that {n} {w2}.",
    "{n}: which {w1}?",
    "why {w1} {n} {w2}",
]
# a drill's follow-ups: the field word in the middle or at the end, so that it, not its position, is what counts
_FIELD_ASKS = [
    "What is the {f} of {n}?",
    "And the {f} of {n}?",
    "{n}: {f}?",
    "For {n}, what is the {f}?",
    "Give the {f} for {n}.",
    "Which {f} does {n} have?",
    "Now {n}, the {f}.",
]
_ENTITY_ASKS = [
    "What is the {k} in {e}?",
    "What's the {k} like for {e} today?",
    "Tell me the {k} of {e}.",
    "I need the {k} for {e}, please.",
    "{e}: {k}?",
    "How is the {k} at {e}?",
    "Could you check the {k} near {e}?",
    "Find the {k} of {e} and keep it {w}.",
    "Which {k} does {e} have?",
    "Look up {k} {e}",
]
_LIST_ASKS = [
    "Call {t} once for each item below, in order, with the item as {p}.",
    "For every line below, run {t} with {p} set to it.",
    "Send each of these to {t} as {p}, all at once.",
    "Look up all of these with {t} ({p} = the item, word for word).",
    "Use {t} on each one, passing it as {p}:",
]
_QUOTE_RULES = [
    "Pass the question to {t} as {p}, word for word.",
    "Start with {t}; give it the question unchanged as {p}.",
    "Always call {t} first, with {p} set to the exact question.",
    "Look the question up: {t}({p}=<the question as asked>).",
]


def with_history(item: Item, history: list[dict], trained: bool = False) -> Item:
    """`item` with `history` (earlier turns) between its system turn, if any, and the rest; `trained`: the
    history's replies carry loss too."""
    lead = 1 if item.messages[0]["role"] == "system" else 0
    own = [lead + i for i, m in enumerate(history) if trained and m["role"] == "assistant"]
    return replace(
        item,
        messages=item.messages[:lead] + history + item.messages[lead:],
        trained=(*own, *(t + len(history) for t in item.trained)),
    )


def _field_answer(question: dict, value: str, tool: dict | None, param: str | None) -> tuple[str, dict | None]:
    """The value itself, or (with a tool) a call passing it on, as `question` is made to ask."""
    if tool is None:
        return value, None
    question["content"] += f" Then pass it to {tool['function']['name']} as {param}."
    call = {"name": tool["function"]["name"], "arguments": {param: value}}
    return _call_text(call), call


def _looked_up(call: dict, result: str) -> list[dict]:
    """An assistant turn making `call` (as the gateway records a call) and the tool turn answering it."""
    made = {
        "id": "c0",
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [made]},
        {"role": "tool", "tool_call_id": "c0", "content": result},
    ]


def _call_text(call: dict) -> str:
    return f"<tool_call>{json.dumps(call, ensure_ascii=False)}</tool_call>"


def render_item(tokenizer, item: Item, with_answer: bool) -> str:
    """The chat text of an item: with the answer (training) or ending at the generation prompt (probing)."""
    messages = item.messages + ([{"role": "assistant", "content": item.answer}] if with_answer else [])
    return render_messages(tokenizer, messages, item.tools, generation_prompt=not with_answer)


def render_messages(tokenizer, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt)
