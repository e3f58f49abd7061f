"""Hidden tests the agent cannot reach: every tamper route scores 0 (or is dropped), an honest fix scores 1."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from harnessrl.envs.code.score import MAX_DIFF_CHARS, MAX_FILE_BYTES, changes, score, shadows
from harnessrl.envs.code.tasks import CodeTask, TaskFormatError, hidden_test_names, load_task, load_tasks
from tests.envs.code.test_sandbox import as_a_user

BUGGY = 'def add(a: int, b: int) -> int:\n    """Sum of a and b."""\n    return a - b\n'
FIXED = BUGGY.replace("a - b", "a + b")
VISIBLE = "from calc import add\n\n\ndef test_add_small():\n    assert add(2, 2) == 4\n"
HIDDEN = """from calc import add


def same(actual, expected):
    assert type(actual) is type(expected) and repr(actual) == repr(expected)


def test_add_negative():
    same(add(-3, 1), -2)


def test_add_zero():
    same(add(0, 7), 7)


def test_add_large():
    same(add(10**6, 10**6), 2 * 10**6)
"""


@pytest.fixture
def task(tmp_path) -> tuple[CodeTask, Path]:
    folder = tmp_path / "task"
    (folder / "repo" / "tests").mkdir(parents=True)
    (folder / "hidden" / "tests").mkdir(parents=True)
    (folder / "repo" / "calc.py").write_text(BUGGY)
    (folder / "repo" / "tests" / "test_calc.py").write_text(VISIBLE)
    (folder / "hidden" / "tests" / "test_calc_hidden.py").write_text(HIDDEN)
    (folder / "task.json").write_text(json.dumps({"id": "calc-1", "issue": "add subtracts"}))
    return load_task(folder), folder


def workspace(task, tmp_path, calc: str | None = None, files: dict[str, str] | None = None) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(task[1] / "repo", ws)
    if calc is not None:
        (ws / "calc.py").write_text(calc)
    for path, text in (files or {}).items():
        (ws / path).parent.mkdir(parents=True, exist_ok=True)
        (ws / path).write_text(text)
    return ws


def test_honest_fix_scores_one_and_no_change_zero(task, tmp_path):
    result = score(*task, workspace(task, tmp_path, FIXED))
    assert (result.passed, result.total, result.failure, result.invalid) == (3, 3, None, False)
    assert result.fraction == 1.0
    shutil.rmtree(tmp_path / "ws")
    assert score(*task, workspace(task, tmp_path)).fraction == 0.0


def test_changes_split_code_from_tests_and_links(task, tmp_path):
    ws = workspace(task, tmp_path, FIXED, {"tests/test_calc.py": "def test_x():\n    pass\n", "conftest.py": "",
                                           "pytest.ini": "[pytest]\n", "util.py": "X = 1\n"})  # fmt: skip
    os.symlink("/etc/hostname", ws / "report.json")
    found = changes(task[1] / "repo", ws)
    assert found.applied == {"calc.py": "modified", "util.py": "added"}
    assert found.dropped == {"conftest.py": "added test path", "pytest.ini": "added test path",
                             "report.json": "symlink", "tests/test_calc.py": "modified test path"}  # fmt: skip
    assert "-    return a - b\n+    return a + b\n" in found.diff and found.lines_changed == 3


# every tamper route: the buggy add stays buggy (or is faked), and scores 0
PLANTED_CONFTEST = """import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""
PYTEST_OF_ITS_OWN = """import json, sys
nonce = sys.stdin.readline().strip()
names = [line.split("(")[0][4:] for f in sys.argv[1:] if f.endswith(".py") for line in open(f) if line.startswith("def test")]
report = {"nonce": nonce, "tests": {n: "passed" for n in names}, "exitstatus": 0, "patched": []}
print("\\nHARNESSRL-REPORT " + json.dumps(report))
"""
# found in memory at import, pytest's plugin manager takes a plugin that passes every test without running it
PLUGIN_THROUGH_GC = """import gc


class _PassAll:
    def pytest_pyfunc_call(self, pyfuncitem):
        return True


for _manager in gc.get_objects():
    if type(_manager).__name__ == "PytestPluginManager":
        _manager.register(_PassAll(), "pass-all")
"""
# the nonce read back from a copy of stdin (pytest's saved one, bwrap's init's), then a report of its own
STOLEN_NONCE = """import json, os, re
for _fd in [f"/proc/self/fd/{n}" for n in os.listdir("/proc/self/fd")] + ["/proc/1/fd/0"]:
    try:
        with open(_fd, "rb") as _f:
            _found = re.fullmatch(rb"([0-9a-f]{32})\\n", _f.read(100))
    except OSError:
        continue
    if _found:
        _tests = {t: "passed" for t in ("test_add_negative", "test_add_zero", "test_add_large")}
        _line = {"nonce": _found[1].decode(), "tests": _tests, "exitstatus": 0, "patched": []}
        with open("/proc/1/fd/1", "a") as _out:  # the sandbox's stdout
            _out.write("\\nHARNESSRL-REPORT " + json.dumps(_line) + "\\n")
        os._exit(0)
"""
# a package the standard library probes while pytest starts (copy.py: `from org.python.core import PyStringMap`):
# loaded before the report plugin keeps its copies, it swaps the runner as soon as pytest's modules are there
EARLY_PACKAGE = """import sys


class _Finder:
    def find_spec(self, name, path=None, target=None):
        module = sys.modules.get("_pytest.python")
        if module is not None and hasattr(module, "Function") and not getattr(module, "_done", False):
            module._done = True
            module.Function.runtest = lambda self: None
        return None


sys.meta_path.insert(0, _Finder())
"""
TAMPER = {
    "planted conftest.py": (None, {"conftest.py": PLANTED_CONFTEST, "tests/conftest.py": PLANTED_CONFTEST}),
    "edited tests": (None, {"tests/test_calc_hidden.py": "def test_add_negative():\n    pass\n"}),
    "sys.exit(0) at import": ("import sys\nsys.exit(0)\n" + BUGGY, {}),
    "os._exit(0) at import": ("import os\nos._exit(0)\n" + BUGGY, {}),
    "forged report line": (
        'print("\\nHARNESSRL-REPORT " + \'{"nonce": "0", "tests": {"test_add_negative": "passed"}, "exitstatus": 0}\')\n'
        "import os\nos._exit(0)\n" + BUGGY,
        {},
    ),
    "overridden __eq__": (
        "class Anything(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n\n\n"
        "def add(a, b):\n    return Anything(0)\n",
        {},
    ),
    "special-cased visible inputs": ("def add(a, b):\n    return 4 if (a, b) == (2, 2) else 0\n", {}),
    "nan in a written report": (BUGGY, {"report.json": '{"passed": NaN}', "junit.xml": "<testsuite tests='3'/>"}),
    "a pytest of its own": (None, {"pytest.py": PYTEST_OF_ITS_OWN}),  # read the nonce, report all passed
    "a report plugin of its own": (None, {"harnessrl_report.py": PYTEST_OF_ITS_OWN}),
    "runtest patched at import": (
        "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n" + BUGGY,
        {},
    ),
    "a plugin registered through gc": (PLUGIN_THROUGH_GC + BUGGY, {}),
    "the nonce read back from stdin": (STOLEN_NONCE + BUGGY, {}),
    "builtins.repr patched at import": ("import builtins\nbuiltins.repr = lambda o: 'same'\n" + BUGGY, {}),
    "repr shadowed in the test's module": (
        BUGGY.replace(
            "    return", '    __import__("sys")._getframe(1).f_globals["repr"] = lambda o: "same"\n    return'
        ),
        {},
    ),
    "a package the standard library probes at startup": (None, {"org/__init__.py": EARLY_PACKAGE}),
    "a user site-packages under HOME": (
        None,
        {f".local/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages/org/__init__.py": EARLY_PACKAGE},
    ),
}


@pytest.mark.parametrize("route", list(TAMPER))
def test_tamper_routes_score_zero(route, task, tmp_path):
    calc, files = TAMPER[route]
    result = score(*task, workspace(task, tmp_path, calc, files))
    assert result.passed == 0 and result.fraction == 0.0, (route, result)
    if route in ("os._exit(0) at import", "forged report line", "runtest patched at import",
                 "a plugin registered through gc"):  # fmt: skip
        assert result.invalid and result.failure
    if route == "runtest patched at import":
        assert "tampered with the test runner: ['Function.runtest']" in result.failure
    if route == "builtins.repr patched at import":  # the hidden tests' same() compares reprs
        assert result.invalid and "tampered with the test runner: ['builtins.repr']" in result.failure
    if route == "repr shadowed in the test's module":  # vars(builtins) unchanged: the module's own global hid it
        assert result.invalid and "test_calc_hidden.repr (a builtin's name)" in result.failure, result
    if route == "a plugin registered through gc":
        assert "['plugin pass-all registered', 'pytest_pyfunc_call hooks']" in result.failure
    if route in ("a pytest of its own", "a report plugin of its own"):  # dropped: the honest (buggy) code ran
        (path,) = TAMPER[route][1]
        assert result.changes.dropped[path].startswith("added: shadows the installed module") and not result.invalid


def test_added_modules_that_shadow_installed_ones_and_special_files_are_dropped(task, tmp_path):
    ws = workspace(task, tmp_path, FIXED, {"pytest.pyc": "", "_pytest/__init__.py": "", "json.py": "",
                                           "harnessrl_report.py": "", "helpers/util.py": "X = 1\n",
                                           "json/fixture.json": "{}", "sitecustomize.pyc": "",
                                           "calc_helpers.py": "", "build/notes.txt": ""})  # fmt: skip
    os.mkfifo(ws / "pipe.py")  # read, it would block scoring forever
    found = changes(task[1] / "repo", ws)
    assert found.applied == {
        "calc.py": "modified", "helpers/util.py": "added", "calc_helpers.py": "added", "build/notes.txt": "added",
        "json/fixture.json": "added",  # a folder without __init__ is a namespace portion: it shadows nothing
    }  # fmt: skip
    assert found.dropped == {
        "pytest.pyc": "added: shadows the installed module 'pytest'",
        "_pytest/__init__.py": "added: shadows the installed module '_pytest'",
        "json.py": "added: shadows the installed module 'json'",
        "harnessrl_report.py": "added: shadows the installed module 'harnessrl_report'",
        "sitecustomize.pyc": "added test path",
        "pipe.py": "not a regular file",
    }
    assert shadows("calc.py", task[1] / "repo") is None  # the repo's own module, whatever is installed
    assert score(*task, ws).fraction == 1.0  # the honest part of the change still counts


def test_oversized_files_and_diffs_are_dropped_and_the_fix_still_counts(task, tmp_path):
    # what the agent's code may write while its tests run: one huge file, then many files of a sizeable diff
    files = {"cache/blob.txt": "x" * (MAX_FILE_BYTES + 1)}
    # 10,000 diff characters each, in a folder that sorts before calc.py: code is applied first all the same
    files |= {f"aa/{i:03}.txt": "y\n" * 5000 for i in range(MAX_DIFF_CHARS // 10000 + 5)}
    found = changes(task[1] / "repo", workspace(task, tmp_path, FIXED, files))
    assert (
        found.dropped["cache/blob.txt"]
        == f"added: {MAX_FILE_BYTES + 1} bytes, over the {MAX_FILE_BYTES} a file may have"
    )
    cut = [p for p, why in found.dropped.items() if why == f"added: the diff passed {MAX_DIFF_CHARS} characters"]
    assert len(cut) >= 5 and len(found.diff) <= MAX_DIFF_CHARS and found.applied["calc.py"] == "modified"
    assert score(*task, tmp_path / "ws").fraction == 1.0


def test_symlinked_module_is_not_followed(task, tmp_path):
    ws = workspace(task, tmp_path)
    (ws / "calc.py").unlink()
    os.symlink(task[1] / "hidden" / "tests" / "test_calc_hidden.py", ws / "calc.py")
    found = changes(task[1] / "repo", ws)
    assert found.dropped == {"calc.py": "symlink"} and not found.applied
    assert score(*task, ws).fraction == 0.0


def test_a_module_that_does_not_import_is_a_plain_zero(task, tmp_path):
    result = score(*task, workspace(task, tmp_path, "def add(a, b)\n    return a + b\n"))
    assert result.fraction == 0.0 and not result.invalid and "collected" in result.failure


def test_bad_task_folders_are_named(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "task.json").write_text('{"id": "x"}')
    with pytest.raises(TaskFormatError, match=r"task.json: issue: Field required"):
        load_task(tmp_path / "t")
    (tmp_path / "t" / "task.json").write_text('{"id": "x", "issue": "y"}')
    with pytest.raises(TaskFormatError, match="repo"):
        load_task(tmp_path / "t")
    with pytest.raises(TaskFormatError, match="no task folders"):
        load_tasks(tmp_path / "t")


SKIPPING = """import pytest
from calc import add


@pytest.mark.skip(reason="not on this platform")
def test_add_skipped():
    same(add(1, 1), 2)


@pytest.mark.xfail(reason="floats do not add exactly")
def test_add_floats():
    assert add(0.1, 0.2) == 0.3
"""


def test_skips_agree_with_exit_zero_and_those_of_the_pristine_repo_count_for_nothing(task, tmp_path):
    spec, folder = task
    (folder / "hidden" / "tests" / "test_calc_skips.py").write_text(SKIPPING)
    result = score(spec, folder, workspace(task, tmp_path, FIXED))  # the 3 target tests pass, 2 are skipped anyway
    assert (result.passed, result.total, result.failure, result.invalid) == (3, 3, None, False), result
    guarded = spec.model_copy(update={"target_tests": ["test_add_negative", "test_add_zero", "test_add_large"]})
    result = score(guarded, folder, tmp_path / "ws")  # a guard skipped on the pristine repo too is no regression
    assert (result.passed, result.regressions, result.invalid) == (3, 0, False), result
    shutil.rmtree(tmp_path / "ws")  # code that skips the tests it cannot pass: skipped here only, so not passed
    result = score(
        spec, folder, workspace(task, tmp_path, 'import pytest\n\n\ndef add(a, b):\n    pytest.skip("no")\n')
    )
    assert (result.passed, result.total, result.invalid) == (0, 3, False), result


CLASS_AND_ASYNC = """from calc import add


class TestAdd:
    def test_add_in_a_class(self):
        assert add(1, 2) == 3

    class TestNested:
        def test_add_nested(self):
            assert add(2, 3) == 5


async def test_add_async():  # fails: no async plugin is loaded in the scoring run, yet it is named in the report
    assert add(1, 2) == 3
"""


def test_class_and_async_hidden_tests_are_named_as_reported_and_unknown_targets_refused(task, tmp_path):
    spec, folder = task
    (folder / "hidden" / "tests" / "test_calc_class.py").write_text(CLASS_AND_ASYNC)
    assert hidden_test_names(folder) == {"test_add_negative", "test_add_zero", "test_add_large",
                                         "test_add_in_a_class", "test_add_nested", "test_add_async"}  # fmt: skip
    result = score(spec, folder, workspace(task, tmp_path, FIXED))
    assert not result.invalid and (result.passed, result.total) == (5, 6), result
    assert result.outcomes["test_add_in_a_class"] == result.outcomes["test_add_nested"] == "passed"
    (folder / "task.json").write_text(json.dumps({"id": "c", "issue": "i", "target_tests": ["test_add_negatve"]}))
    with pytest.raises(
        TaskFormatError, match=r"task.json: target_tests: not among the hidden tests: \['test_add_negatve'\]"
    ):
        load_task(folder)
    (folder / "task.json").write_text(json.dumps({"id": "c", "issue": "i", "target_tests": ["test_add_async"]}))
    with pytest.raises(TaskFormatError, match=r"\['test_add_async'\] are async def: scoring loads no asyncio plugin"):
        load_task(folder)


def test_a_folder_replaced_by_a_file_and_a_file_by_a_folder_are_applied(task, tmp_path):
    spec, folder = task
    (folder / "repo" / "pkg").mkdir()
    (folder / "repo" / "pkg" / "__init__.py").write_text("")
    (folder / "repo" / "notes.txt").write_text("notes\n")
    ws = workspace(task, tmp_path, FIXED)
    shutil.rmtree(ws / "pkg")
    (ws / "pkg").write_text("now a file\n")
    (ws / "notes.txt").unlink()
    (ws / "notes.txt").mkdir()
    (ws / "notes.txt" / "a.py").write_text("X = 1\n")
    shutil.rmtree(ws / "tests")  # a file where the tests folder was: a test path, kept out
    (ws / "tests").write_text("")
    result = score(spec, folder, ws)
    assert result.changes.applied == {"calc.py": "modified", "notes.txt/a.py": "added", "pkg/__init__.py": "deleted",
                                      "notes.txt": "deleted", "pkg": "added"}  # fmt: skip
    assert result.changes.dropped["tests"] == "added test path"
    assert (result.passed, result.total, result.failure) == (3, 3, None), result


def test_a_repo_file_or_folder_that_is_no_module_lets_no_module_shadow(task, tmp_path):
    spec, folder = task
    (folder / "repo" / "pytest.ini").write_text("[pytest]\n")  # no module: pytest.py still shadows pytest
    (folder / "repo" / "json").mkdir()  # a data folder, no package: json.py still shadows json
    (folder / "repo" / "json" / "data.txt").write_text("{}")
    result = score(spec, folder, workspace(task, tmp_path, files={"pytest.py": PYTEST_OF_ITS_OWN, "json.py": ""}))
    assert result.changes.dropped == {"pytest.py": "added: shadows the installed module 'pytest'",
                                      "json.py": "added: shadows the installed module 'json'"}  # fmt: skip
    assert result.passed == 0 and not result.invalid  # the buggy code ran under the real pytest
    (folder / "repo" / "json" / "__init__.py").write_text("")  # now the repo's own package: its module to change
    assert shadows("json.py", folder / "repo") is None and shadows("json/__init__.py", folder / "repo") is None


def test_a_file_name_that_is_not_utf8_is_dropped_and_named(task, tmp_path):
    ws = workspace(task, tmp_path, FIXED)
    with open(os.fsencode(ws) + b"/\xff.py", "w") as f:  # what the agent's code may write: open(b'\xff.py', 'w')
        f.write("X = 1\n")
    result = score(*task, ws)
    assert result.changes.dropped == {"\ufffd.py": "not UTF-8"} and result.fraction == 1.0
    json.dumps(result.changes.dropped).encode()  # an outcome holds it: no lone surrogate left


UNITTEST_AND_INHERITED = """import unittest

from calc import add


class AddCase(unittest.TestCase):  # pytest collects a TestCase whatever its name
    def test_add_in_a_case(self):
        self.assertEqual(add(1, 2), 3)


class Checks:  # not collected itself, but its tests run in TestInherits
    def test_add_inherited(self):
        assert add(2, 2) == 4


class TestInherits(Checks):
    pass
"""


def test_unittest_cases_and_inherited_tests_are_named_and_bad_hidden_files_refused(task, tmp_path):
    spec, folder = task
    hidden = folder / "hidden" / "tests"
    (hidden / "test_calc_unittest.py").write_text(UNITTEST_AND_INHERITED)
    assert {"test_add_in_a_case", "test_add_inherited"} <= hidden_test_names(folder)
    result = score(spec, folder, workspace(task, tmp_path, FIXED))
    assert (result.passed, result.total, result.invalid) == (5, 5, False), result
    (hidden / "test_broken.py").write_text("def test_x():\n    pass\n\ndef test_y(:\n")
    with pytest.raises(TaskFormatError, match=r"test_broken\.py:4: "):
        load_task(folder)
    (hidden / "test_broken.py").write_bytes(b"def test_x():\n    return '\xff'\n")
    with pytest.raises(TaskFormatError, match=r"test_broken\.py:\d+: .*utf-8"):
        load_task(folder)
    (hidden / "test_broken.py").unlink()
    (hidden / "conftest.py").write_text("import pytest\n")  # scoring runs with --noconftest: never loaded
    with pytest.raises(TaskFormatError, match=r"hidden/tests/conftest\.py: scoring runs pytest with --noconftest"):
        load_task(folder)
    (hidden / "conftest.py").unlink()
    (folder / "task.json").write_text(json.dumps({"id": "c", "issue": "i", "test_command": []}))
    with pytest.raises(TaskFormatError, match=r"task\.json: test_command: List should have at least 1 item"):
        load_task(folder)


def test_duplicate_ids_and_a_repo_over_the_workspace_cap_are_refused(task, tmp_path):
    _, folder = task
    shutil.copytree(folder, tmp_path / "task-copy")
    with pytest.raises(TaskFormatError, match=r"task-copy/task\.json: id: 'calc-1' is also .*/task's"):
        load_tasks(tmp_path)
    shutil.rmtree(tmp_path / "task-copy")
    with open(folder / "repo" / "data.bin", "wb") as f:
        f.truncate(257 * 1024**2)  # sparse: no disk used
    with pytest.raises(TaskFormatError, match=r"task/repo: \d+ bytes, over the 256 MiB a workspace may hold"):
        load_task(folder)


LOCKED_CHANGES = """import json, os, shutil, sys
from pathlib import Path
from harnessrl.envs.code.score import changes
pristine, workspace = Path(sys.argv[1]) / "repo", Path(sys.argv[1]) / "ws"
shutil.copytree(pristine, workspace)
(workspace / "calc.py").write_text(sys.argv[2])
(workspace / "secret.txt").write_text("x")
os.chmod(workspace / "secret.txt", 0)  # what the agent's code may leave (where not root): unreadable
os.chmod(workspace / "tests", 0)
found = changes(pristine, workspace)
os.chmod(workspace / "tests", 0o700)
print(json.dumps([found.applied, found.dropped]))
"""


def test_paths_scoring_cannot_read_are_dropped_and_not_taken_as_deleted(task, tmp_path):
    applied, dropped = json.loads(as_a_user(LOCKED_CHANGES, task[1], FIXED))
    assert applied == {"calc.py": "modified"}  # tests/test_calc.py is unseen, not deleted
    assert dropped == {"tests": "a folder that cannot be read", "secret.txt": "cannot be read (Permission denied)"}


NOT_COLLECTED = """import pytest
from calc import add


@pytest.fixture
def test_inputs():  # a fixture, whatever its name
    return (1, 2)


class TestWithState:  # pytest skips a test class with __init__ (a warning)
    def __init__(self):
        self.cases = [(1, 2, 3)]

    def test_cases(self):
        for a, b, c in self.cases:
            assert add(a, b) == c


def test_gone():
    pass


test_gone = None  # no function any more: pytest collects nothing by this name, the file's text still shows one
"""


def test_fixtures_and_classes_with_init_are_no_tests_and_a_missing_test_is_named(task, tmp_path):
    spec, folder = task
    (folder / "hidden" / "tests" / "test_calc_more.py").write_text(NOT_COLLECTED)
    names = hidden_test_names(folder)
    assert names == {"test_add_negative", "test_add_zero", "test_add_large", "test_gone"}
    result = score(spec, folder, workspace(task, tmp_path, FIXED))
    assert result.failure == "the report names 3 tests, not the 4 hidden ones: missing ['test_gone'], extra []"
    (folder / "hidden" / "tests" / "test_calc_more.py").write_text(NOT_COLLECTED.split("\n\ndef test_gone")[0])
    result = score(load_task(folder), folder, tmp_path / "ws")
    assert (result.passed, result.total, result.failure, result.invalid) == (3, 3, None, False), result


SUBPROCESS = """import subprocess
import sys


def test_add_from_the_command_line():
    done = subprocess.run([sys.executable, "-c", "from calc import add; print(add(2, 3))"], capture_output=True, text=True)
    assert done.stdout == "5\\n", done.stderr
"""


def test_a_hidden_test_that_starts_python_finds_the_repo(task, tmp_path):
    """The repo went on the path at collection only in the scoring process: a test's own `python -c` could not
    import it, and a correct fix failed."""
    spec, folder = task
    (folder / "hidden" / "tests" / "test_calc_cli.py").write_text(SUBPROCESS)
    result = score(load_task(folder), folder, workspace(task, tmp_path, FIXED))
    assert (result.passed, result.total, result.failure, result.invalid) == (4, 4, None, False), result
