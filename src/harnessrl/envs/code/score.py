"""Scoring a submission against hidden tests the agent never had in reach.

1. The agent's changes are read as a diff of its workspace against the task's pristine repo/;
   changes to test paths (tests, conftest.py, pytest/tox config, sitecustomize, .pth), symlinks,
   files that are not regular (a FIFO would block the read), and added top-level modules that would
   shadow an installed one (a `pytest.py` or `pytest.pyc` of its own could print any report) are
   dropped (and listed).
2. The rest is applied to a fresh copy of repo/, the hidden tests are laid over it, and pytest runs
   there in a new sandbox with plugin autoload off, no conftest, our own config file and only our
   report plugin (`harnessrl_report`, first on the path under PYTHONSAFEPATH; the repo goes on the path only
   when collection begins, so none of its code runs while pytest starts), tracebacks, captured
   output and warnings off (so the report line is not pushed out of the kept output by honest failures).
3. The report travels on stdout under a nonce the plugin reads from stdin when pytest imports it,
   before any test module, and then points stdin at /dev/null (so it is in no file, argument,
   environment variable or copy of stdin the tested code could read). It must name exactly the hidden
   tests, each once, with a known outcome, agree with pytest's exit code, appear once, and find
   unchanged the functions that run and report a test (`Function.runtest`, `call_and_report`, ...:
   the plugin keeps them at import and compares at the end) and every hook's implementations, with no
   plugin registered since collection began (a plugin the tested code registers, its
   `pytest_pyfunc_call` passing every test); anything else (a missing report, `os._exit(0)` at import, a
   forged or non-finite line, a swapped runner) is a failed score with its reason, never a number.

The tested code runs in pytest's process, so a determined attack from inside it (editing this
plugin's state in memory, then forcing the exit code) is not ruled out by the report alone; the
`test_tampering` detector flags a diff that names the runner's internals (rewards/detectors.py).

Knows tasks and the sandbox; nothing about models.
"""

from __future__ import annotations

import difflib
import functools
import importlib.machinery
import json
import os
import secrets
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.envs.code import sandbox
from harnessrl.envs.code.tasks import TEST_PATH, CodeTask, hidden_test_names

PLUGIN = '''"""harnessrl's pytest report: one line on the real stdout, under the nonce read from stdin."""
import builtins, json, os, sys

import _pytest.python, _pytest.reports, _pytest.runner

# what runs a test and reports it: tested code that swaps one (to pass every test) is named in the report
_GUARDED = {
    "Function.runtest": (_pytest.python.Function, "runtest"),
    "pytest_pyfunc_call": (_pytest.python, "pytest_pyfunc_call"),
    "pytest_runtest_call": (_pytest.runner, "pytest_runtest_call"),
    "call_and_report": (_pytest.runner, "call_and_report"),
    "runtestprotocol": (_pytest.runner, "runtestprotocol"),
    "TestReport.from_item_and_call": (_pytest.reports.TestReport, "from_item_and_call"),
    "CallInfo.from_call": (_pytest.runner.CallInfo, "from_call"),
}


def _now():
    return {name: vars(owner).get(attr) for name, (owner, attr) in _GUARDED.items()}


def _foreign(guarded):
    """The guarded functions not defined in pytest's own files: swapped before this plugin was imported."""
    home = os.path.dirname(_pytest.python.__file__) + os.sep
    code = lambda f: getattr(getattr(f, "__func__", f), "__code__", None)  # noqa: E731  (classmethods too)
    return {f"{name} defined outside _pytest" for name, f in guarded.items()  # None: one this pytest lacks
            if f is not None and (code(f) is None or not code(f).co_filename.startswith(home))}


def _hooks():
    """Every hook's caller and implementations: a plugin the tested code registers (found through
    gc.get_objects(), its pytest_pyfunc_call passing every test) or an implementation it slips in changes them."""
    hooks = vars(_state["manager"].hook)
    return {name: [caller, *(impl.function for impl in caller.get_hookimpls())] for name, caller in hooks.items()}


def _check():
    if "hooks" in _state:  # kept when collection began: anything since is the tested code's
        now, then = _hooks(), _state["hooks"]
        changed = [name for name in now.keys() | then.keys() if now.get(name) != then.get(name)]
        _state["tampered"].update(f"{name} hooks" for name in changed)
        # a builtin replaced or removed (`builtins.repr = lambda o: "same"` defeats a test's repr comparison);
        # one added is no threat (gettext.install() adds `_`)
        present = vars(builtins)
        _state["tampered"].update(f"builtins.{name}" for name, value in _state["builtins"].items()
                                  if present.get(name, _check) is not value)
        # or a test module's own global of a builtin's name set or changed (sys._getframe(1).f_globals["repr"] = ...)
        for module, then in _state.get("modules", []):
            now = _shadowing(module)
            _state["tampered"].update(f"{module.__name__}.{name} (a builtin's name)" for name in now.keys() | then.keys()
                                      if now.get(name, _check) is not then.get(name, _check))


def _shadowing(module):
    return {name: value for name, value in vars(module).items() if name in _state["builtins"]}


def pytest_collection_finish(session):  # the test modules' globals of builtins' names, as their files made them
    modules = {id(m): m for m in (item.getparent(_pytest.python.Module) for item in session.items) if m is not None}
    _state["modules"] = [(m.obj, _shadowing(m.obj)) for m in modules.values()]


# read when -p imports this module, before pytest's capture swaps stdin and stdout
_state = {"nonce": sys.stdin.readline().strip(), "out": os.fdopen(os.dup(1), "w"), "tests": {}, "guarded": _now()}
_state["tampered"] = _foreign(_state["guarded"])
# then stdin is /dev/null: pytest's capture, which starts later, saves a copy of fd 0 that the tested code could
# read again through /proc/self/fd; now that copy is of /dev/null
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = open(os.devnull)


def pytest_collection(session):  # the last moment before any tested code is imported
    _state["manager"] = session.config.pluginmanager
    _state["hooks"] = _hooks()
    _state["builtins"] = dict(vars(builtins))
    # only now the tested repo goes on the path: on it from the start, a package the standard library probes
    # while pytest starts (copy.py's `org.python.core`) would run before the copies above were kept
    sys.path.insert(0, str(session.config.rootpath))
    # and for the processes the tests start (`python -m pkg`): PYTHONSAFEPATH keeps their working folder off the path
    os.environ["PYTHONPATH"] = os.pathsep.join([str(session.config.rootpath), os.environ.get("PYTHONPATH", "")])


def pytest_plugin_registered(plugin, manager):  # (plugin_name arrived in pytest 8.1)
    if "hooks" in _state:  # a plugin registered once collection began: the tested code's
        _state["tampered"].add(f"plugin {manager.get_name(plugin)} registered")


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::")[-1].split("[")[0]
    if report.when == "call" or report.outcome != "passed":
        previous = _state["tests"].get(name)
        _state["tests"][name] = report.outcome if previous in (None, "passed") else previous


def pytest_runtest_logfinish(nodeid, location):  # after each test too: a plugin it registers, then removes
    _check()


def pytest_collectreport(report):
    if report.failed:
        _state["tests"]["<collection>"] = "error"


def pytest_sessionfinish(session, exitstatus):
    _check()
    patched = sorted(name for name, now in _now().items() if now is not _state["guarded"][name])
    line = {"nonce": _state.get("nonce"), "tests": _state.get("tests", {}), "exitstatus": int(exitstatus),
            "patched": patched + sorted(_state["tampered"])}
    _state["out"].write("\\nHARNESSRL-REPORT " + json.dumps(line) + "\\n")
    _state["out"].flush()
'''
INI = "[pytest]\naddopts = -p no:cacheprovider\n"
OUTCOMES = {"passed", "failed", "skipped", "error"}
MAX_FILE_BYTES = 256 * 1024  # a workspace file the tools read and scoring applies (difflib is quadratic)
MAX_DIFF_CHARS = 200_000  # the diff an outcome keeps (twice: answer and info); changes past it are dropped
MARK = "HARNESSRL-REPORT "


@dataclass
class Changes:
    """The agent's workspace against the pristine repo: applied files, dropped ones, and the diff text."""

    applied: dict[str, str] = field(default_factory=dict)  # path -> added | modified | deleted
    dropped: dict[str, str] = field(default_factory=dict)  # path -> why
    diff: str = ""

    @property
    def lines_changed(self) -> int:
        return sum(1 for line in self.diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---"))


@dataclass
class Score:
    passed: int  # target tests passed
    total: int  # target tests
    regressions: int = 0  # other hidden tests failed
    others: int = 0
    failure: str | None = None  # why nothing passed without a test failing: no collection, a timeout, a bad report
    invalid: bool = False  # the report was missing, forged or malformed (a tamper signal, scored 0)
    outcomes: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    guards: dict[str, str] = field(default_factory=dict)
    changes: Changes | None = None  # what of the workspace was applied and dropped (set by `score`)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total and self.failure is None else 0.0


def changes(pristine: Path, workspace: Path) -> Changes:
    """What the agent changed, split into what scoring applies and what it drops (tests, config, links, a file over
    MAX_FILE_BYTES, changes past MAX_DIFF_CHARS of diff: the agent's code can write anything while tests run).
    `.py` files come first, so files of other kinds cannot crowd a fix out of the diff."""
    result = Changes()
    unread: list[str] = []  # folders of the workspace it may not list (made so by the agent's code, where not root)
    before, after = _files(pristine), _files(workspace, unread)
    result.dropped |= {_utf8(folder): "a folder that cannot be read" for folder in unread}
    diff: list[str] = []
    chars = 0
    for path in sorted(set(before) | set(after), key=lambda p: (not p.endswith(".py"), p)):  # code first
        old, new = before.get(path), after.get(path)
        if any(folder == "." or path.startswith(f"{folder}/") for folder in unread):  # unseen, so not deleted
            continue
        if new is not None and (odd := _not_regular(new) or _unreadable(new)):
            result.dropped[_utf8(path)] = odd
            continue
        if old is not None and new is not None and _same(old, new):
            continue
        if _utf8(path) != path:  # a name the agent's code wrote in bytes: no JSON (so no outcome) could hold it
            result.dropped[_utf8(path)] = "not UTF-8"
            continue
        kind = "added" if old is None else "deleted" if new is None else "modified"
        if TEST_PATH.search(path) or TEST_PATH.search(path + "/"):  # a file `tests` would replace the tests folder
            result.dropped[path] = f"{kind} test path"
            continue
        if kind == "added" and (shadowed := shadows(path, pristine)):
            result.dropped[path] = f"added: shadows the installed module {shadowed!r}"
            continue
        if new is not None and (why := too_big(new)):
            result.dropped[path] = f"{kind}: {why}"
            continue
        if chars >= MAX_DIFF_CHARS:  # full: dropped unread
            result.dropped[path] = f"{kind}: the diff passed {MAX_DIFF_CHARS} characters"
            continue
        lines = [line if line.endswith("\n") else line + "\n" for line in
                 difflib.unified_diff(_lines(old), _lines(new), f"a/{path}", f"b/{path}")]  # fmt: skip
        if chars + (size := sum(map(len, lines))) > MAX_DIFF_CHARS:
            result.dropped[path] = f"{kind}: the diff passed {MAX_DIFF_CHARS} characters"
            continue
        chars += size
        result.applied[path] = kind
        diff += lines
    result.diff = "".join(diff)
    return result


def score(task: CodeTask, folder: Path, workspace: Path, limits: sandbox.Limits = sandbox.Limits()) -> Score:
    """Apply the workspace's non-test changes to a fresh copy, add the hidden tests, run them, read the report.
    A test skipped here and on the pristine repo too (a skip mark, a missing optional package) counts for
    nothing: it leaves the target and the regression guards."""
    expected = hidden_test_names(folder)
    target = set(task.target_tests) or expected
    found = changes(folder / "repo", workspace)
    result = _read_report(*_run_hidden(task, folder, workspace, found, limits), expected, target)
    if result.failure is None and "skipped" in result.outcomes.values():  # the pristine repo's run says which count
        pristine = _read_report(*_run_hidden(task, folder, workspace, Changes(), limits), expected, target).outcomes
        skipped = {t for t, outcome in result.outcomes.items() if outcome == pristine.get(t) == "skipped"}
        if target - skipped:
            result = _counted(result.outcomes, expected - skipped, target - skipped, result.seconds, result.guards)
        else:
            result.failure = "every target test is skipped, on the pristine repo too"
    result.changes = found
    return result


def _run_hidden(
    task: CodeTask, folder: Path, workspace: Path, found: Changes, limits: sandbox.Limits
) -> tuple[sandbox.SandboxResult, str]:
    """The hidden tests run on a fresh copy of repo/ with the `found` changes of the workspace; the run and its nonce."""
    with tempfile.TemporaryDirectory(prefix="harnessrl-score-") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(folder / "repo", root, symlinks=False)
        for path, kind in sorted(found.applied.items(), key=lambda item: item[1] != "deleted"):  # deletions first
            _put(root, path, None if kind == "deleted" else workspace / path)
        hidden = folder / "hidden"
        for path in sorted(p for p in hidden.rglob("*") if p.is_file()):
            _put(root, str(path.relative_to(hidden)), path)
        support = Path(tmp) / "support"  # beside the tested tree, mounted read-only in the run
        support.mkdir()
        (support / "harnessrl_report.py").write_text(PLUGIN)
        (support / "pytest.ini").write_text(INI)
        nonce = secrets.token_hex(16)
        tests = sorted(str(p.relative_to(hidden)) for p in hidden.rglob("*.py"))
        command = [
            *python_argv(task.test_command), "-c", str(support / "pytest.ini"), "--rootdir", str(root),
            "--noconftest", "-p", "harnessrl_report", "-q", "--tb=no", "--show-capture=no", "-rN",
            "--disable-warnings", *tests,
        ]  # fmt: skip
        # the repo is on no path until the plugin puts it there at collection (PYTHONSAFEPATH: `-m` does not put
        # it first; PYTHONNOUSERSITE: HOME is the repo, so no site-packages of its own under .local)
        env = {"PYTHONPATH": str(support), "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1",
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # fmt: skip
        return sandbox.run(command, root, limits, env=env, stdin=nonce + "\n", read_only=[support]), nonce


def _put(root: Path, path: str, source: Path | None) -> None:
    """Copy `source` to root/path (delete it where None), first removing whatever is in the way: a folder where
    the file goes (pkg/ replaced by a file pkg), a file where one of its folders goes (notes.txt/a.py)."""
    target = root / path
    for above in reversed(Path(path).parents[:-1]):
        if (root / above).is_file():
            (root / above).unlink()
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
    if source is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


def _read_report(run: sandbox.SandboxResult, nonce: str, expected: set[str], target: set[str]) -> Score:
    def failed(why: str, invalid: bool = True) -> Score:
        return Score(0, len(target), failure=why, invalid=invalid, seconds=run.seconds, guards=run.guards)

    if run.timed_out:
        return failed(f"the hidden tests timed out ({run.seconds:.0f} s)", invalid=False)
    if run.disk_full:
        return failed("the hidden tests' run wrote more than the workspace may hold", invalid=False)
    lines = [line[len(MARK) :] for line in run.stdout.splitlines() if line.startswith(MARK)]
    if len(lines) != 1:
        return failed(f"{len(lines)} report lines (exit code {run.exit_code}); expected exactly 1")
    try:
        report = json.loads(lines[0], parse_constant=_reject_constant)
    except ValueError as exc:
        return failed(f"the report is not JSON: {exc}")
    if not isinstance(report, dict) or report.get("nonce") != nonce:
        return failed("the report does not carry this run's nonce (forged)")
    if report.get("patched") != []:
        return failed(f"the tested code tampered with the test runner: {report.get('patched')}")
    tests = report.get("tests")
    if isinstance(tests, dict) and tests.get("<collection>") == "error" and report.get("exitstatus") == run.exit_code:
        return failed("the hidden tests could not be collected (the module does not import?)", invalid=False)
    if not isinstance(tests, dict) or set(tests) != expected:
        named = set(tests) if isinstance(tests, dict) else set()
        missing, extra = sorted(expected - named)[:3], sorted(named - expected)[:3]
        return failed(
            f"the report names {len(named)} tests, not the {len(expected)} hidden ones: missing {missing}, extra {extra}"
        )
    if not set(tests.values()) <= OUTCOMES:
        return failed(f"unknown outcomes in the report: {sorted(set(tests.values()) - OUTCOMES)}")
    exit_zero = all(v in ("passed", "skipped") for v in tests.values())  # pytest exits 0 on skips and xfails too
    if report.get("exitstatus") != run.exit_code or (run.exit_code == 0) != exit_zero:
        return failed(f"exit code {run.exit_code} does not agree with the report ({report.get('exitstatus')})")
    return _counted(tests, expected, target, run.seconds, run.guards)


def _counted(tests: dict[str, str], expected: set[str], target: set[str], seconds: float, guards: dict) -> Score:
    """Target tests passed, and the other hidden tests that did not pass (regressions)."""
    passed = sum(tests[t] == "passed" for t in target)
    others = expected - target
    regressions = sum(tests[t] != "passed" for t in others)
    return Score(passed, len(target), regressions, len(others), outcomes=tests, seconds=seconds, guards=guards)


def _reject_constant(name: str):
    raise ValueError(f"non-finite value {name}")


def python_argv(command: list[str]) -> list[str]:
    """The task's pytest argv with `python` as this interpreter (the sandbox sees the same file system)."""
    return [sys.executable if part in ("python", "python3") else part for part in command]


def shadows(path: str, pristine: Path) -> str | None:
    """The installed module an added path would shadow in the scoring run (the repo is on the path before
    the installed packages): for a top-level module file (`pytest.py`, `pytest.pyc`, an extension) or a
    package's `__init__`, its name where that is our plugin or a module installed with this Python (the
    standard library, site-packages) and not one the task's repo has itself; None otherwise (a folder
    without `__init__` is a namespace portion, which never shadows a module)."""
    top, _, rest = path.partition("/")
    if rest:  # inside a folder: only the folder's __init__ makes it a package that can shadow one
        name = top if rest.partition(".")[0] == "__init__" and _importable(rest) else ""
    else:
        name = top.partition(".")[0] if _importable(top) else ""
    if not name.isidentifier() or _in_repo(pristine, name):
        return None
    if name == "harnessrl_report":
        return name
    spec = importlib.machinery.PathFinder.find_spec(name, _installed_paths())  # no finder hooks, no imports
    return name if spec is not None and spec.origin not in (None, "namespace") else None


def _importable(filename: str) -> bool:
    return any(filename.endswith(suffix) for suffix in importlib.machinery.all_suffixes())


def _in_repo(pristine: Path, name: str) -> bool:
    """Whether the task's repo has module `name` itself, in a form Python imports: its pytest.ini or a json/ data
    folder is no module, and must not let the agent add a pytest.py or json.py."""
    suffixes = importlib.machinery.all_suffixes()
    return any((pristine / f"{name}{s}").is_file() or (pristine / name / f"__init__{s}").is_file() for s in suffixes)


@functools.cache
def _installed_paths() -> tuple[str, ...]:
    """This Python's own folders on sys.path: the standard library, lib-dynload, site-packages."""
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return tuple(p for p in sys.path if p and any(Path(p).resolve().is_relative_to(x) for x in prefixes))


def _not_regular(path: Path) -> str | None:
    """Why a workspace path is not read (a link, or a FIFO, socket or device, whose read could block), or None."""
    mode = os.lstat(path).st_mode
    return "symlink" if stat.S_ISLNK(mode) else None if stat.S_ISREG(mode) else "not a regular file"


def _unreadable(path: Path) -> str | None:
    """Why a regular file cannot be read (made so by the agent's code, where not root), or None."""
    try:
        path.open("rb").close()
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    return None


def too_big(path: Path) -> str | None:
    """Why a regular file is too big to read (over MAX_FILE_BYTES), or None."""
    size = path.stat().st_size
    return f"{size} bytes, over the {MAX_FILE_BYTES} a file may have" if size > MAX_FILE_BYTES else None


def _same(a: Path, b: Path) -> bool:
    return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


def regular_files(root: Path) -> list[Path]:
    """Regular files under root with UTF-8 names, links never followed (the agent's tools read only these)."""
    return sorted(path for name, path in _files(root).items() if _not_regular(path) is None and _utf8(name) == name)


def _utf8(path: str) -> str:
    """A path as UTF-8 text: bytes that are not UTF-8 (os.walk's surrogate escapes) become U+FFFD."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _files(root: Path, unread: list[str] | None = None) -> dict[str, Path]:
    """Files, links (to files or folders, never followed) and other entries under root, by relative path; the
    folders it cannot list go to `unread` (relative paths too)."""

    def skipped(error: OSError) -> None:
        if unread is not None:
            unread.append(os.path.relpath(error.filename, root))

    found = {}
    for folder, dirs, files in os.walk(root, onerror=skipped):
        for name in files + [d for d in dirs if (Path(folder) / d).is_symlink()]:
            path = Path(folder) / name
            found[str(path.relative_to(root))] = path
    return found


def _lines(path: Path | None) -> list[str]:
    if path is None:
        return []
    return path.read_bytes().decode("utf-8", errors="replace").splitlines(keepends=True)
