import asyncio
import json
import threading

from harnessrl.harness import Toolbox, tool_schema


async def lookup(name: str, limit: int = 3) -> list[str]:
    """Find records by name.

    Args:
        name: who to look for
        limit: most records to return
    """
    return [name] * limit


def explode(city: str) -> str:
    """Always fails."""
    raise KeyError(city)


RELEASE = threading.Event()


def stuck(seconds: float) -> str:
    """Blocks its thread (a tool that cannot be cancelled)."""
    RELEASE.wait(seconds)
    return "late"


def quick() -> str:
    """Answers at once."""
    return "ok"


async def slow(seconds: float) -> str:
    """Sleeps."""
    await asyncio.sleep(seconds)
    return "done"


def parse(flags: str) -> str:
    """A tool that parses its input with argparse, which exits on what it refuses."""
    import argparse

    parser = argparse.ArgumentParser(prog="parse", exit_on_error=True)
    parser.add_argument("--n", type=int)
    return str(parser.parse_args(flags.split()).n)


async def parse_later(flags: str) -> str:
    """The same, async."""
    return parse(flags)


def first(items: list[str]) -> str:
    """The first item (next() on an empty list raises StopIteration)."""
    return next(iter(items))


async def fetch(url: str) -> str:
    """A tool with a socket timeout of its own."""
    await asyncio.wait_for(asyncio.sleep(5), 0.05)
    return url


def reading(celsius: str) -> dict:
    """A tool that validates what its upstream returned, and returns what JSON cannot hold."""
    from pydantic import BaseModel

    class Reading(BaseModel):
        temp: float

    if celsius == "keys":
        return {(0, 0): 1.0}
    return Reading.model_validate({"temp": celsius}).model_dump()


def test_schema_comes_from_signature_and_docstring():
    schema = tool_schema(lookup)["function"]
    assert schema["name"] == "lookup" and schema["description"] == "Find records by name."
    assert schema["parameters"]["required"] == ["name"]
    assert schema["parameters"]["properties"]["limit"] == {
        "default": 3,
        "type": "integer",
        "description": "most records to return",
    }


async def test_bad_calls_and_crashing_or_hanging_tools_become_observations():
    """The tool's own errors are its own: a sys.exit was a crashed process, a StopIteration a call hung to the timeout,
    its own timeout or validation error was blamed on the toolbox's timeout or on the model's arguments."""
    box = Toolbox([lookup, explode, slow, parse, parse_later, first, fetch, reading], timeout=1.0)
    assert await box.call("lookup", '{"name": "Ada", "limit": 2}') == (json.dumps(["Ada", "Ada"]), True)
    assert await box.call("lookup", {"name": "Ada", "limit": "2"}) == (json.dumps(["Ada", "Ada"]), True)  # coerced
    cases = {
        ("lookup", '{"limit": 2}'): "argument name: Missing required argument",
        ("lookup", '{"name": "Ada", "limit": "many"}'): "argument limit:",
        ("lookup", "{not json"): "not valid JSON",
        ("lookup", "[1, 2]"): "must be a JSON object",
        ("missing", "{}"): "unknown tool 'missing'",
        ("explode", '{"city": "Oslo"}'): "explode raised KeyError: 'Oslo'",
        ("slow", '{"seconds": 5}'): "slow timed out after 1.0 s",
        ("parse", '{"flags": "--n x"}'): "parse raised RuntimeError: the tool called sys.exit(2)",
        ("parse_later", '{"flags": "--n x"}'): "parse_later raised RuntimeError: the tool called sys.exit(2)",
        ("first", '{"items": []}'): "first raised RuntimeError: StopIteration",
        ("fetch", '{"url": "u"}'): "fetch raised TimeoutError",
        ("reading", '{"celsius": "warm"}'): "reading raised ValidationError",
        ("reading", '{"celsius": "keys"}'): "reading raised TypeError: keys must be",
    }
    for (name, args), expected in cases.items():
        text, ok = await box.call(name, args)
        assert not ok and text.startswith("error:") and expected in text, text
    assert await box.call("parse", '{"flags": "--n 3"}') == ("3", True)


async def test_blocking_tools_that_time_out_do_not_starve_the_next_calls():
    """A thread cannot be stopped: eight blocking calls past their timeout still hold theirs. The next call runs at
    once (the loop's pool has 6 workers on 2 cores: it would queue behind them and time out unrun)."""
    box = Toolbox([stuck, quick], timeout=0.2)
    try:
        for _ in range(8):
            assert await box.call("stuck", '{"seconds": 30}') == ("error: stuck timed out after 0.2 s", False)
        assert await box.call("quick", "{}") == ("ok", True)
    finally:
        RELEASE.set()


def test_a_lone_surrogate_is_named_where_it_is_in_the_arguments():
    def note(items: list[dict[str, str]]) -> str:
        return "kept"

    box = Toolbox([note])
    result, ok = asyncio.run(box.call("note", '{"items": [{"a": "x"}, {"b": "ok\\udc80"}]}'))
    assert (
        not ok and result == "error: items.1.b holds '\\udc80' at character 2, a lone surrogate no UTF-8 text can carry"
    )
    result, ok = asyncio.run(box.call("note", '{"items": [{"\\ud800": "x"}]}'))
    assert not ok and result.startswith("error: items.0 (a key) holds '\\ud800' at character 0")
    emoji = '{"items": [{"a": "\\ud83d\\ude00"}]}'  # a surrogate pair: one character, not a lone surrogate
    assert asyncio.run(box.call("note", emoji)) == ("kept", True)
    result, _ = asyncio.run(box.call("note", '{"items": [], "arguments": {"x": "\\ud800"}}'))
    assert result.startswith("error: arguments.x holds '\\ud800' at character 0")  # a key named arguments is a key
