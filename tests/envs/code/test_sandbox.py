"""Hostile code in the sandbox: contained, and reported. Each guard's test runs where the machine
gives that guard (scripts/setup.sh installs bubblewrap; cgroups need root) and is skipped, by name,
where it does not."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import harnessrl
from harnessrl.envs.code import sandbox
from harnessrl.envs.code.sandbox import Limits

QUICK = Limits(wall_seconds=3, cpu_seconds=10, memory_mb=512, processes=32)
GUARDS = sandbox.run(["true"], Path("/")).guards


def need(guard: str) -> None:
    if GUARDS[guard] == "off":
        pytest.skip(f"this machine gives no {guard} guard ({GUARDS})")


def py(code: str) -> list[str]:
    return ["python3", "-c", code]


def as_a_user(script: str, *args) -> str:
    """Run a Python `script` as a user whom file modes bind (root, here, without CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH through setpriv): its stdout, where it exits 0."""
    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root, and no setpriv (util-linux) to run as one whom file modes bind")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    env = {**os.environ, "PYTHONPATH": str(Path(harnessrl.__file__).parents[1])}
    done = subprocess.run([*prefix, sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_ordinary_command_runs_in_the_workspace(tmp_path):
    (tmp_path / "in.txt").write_text("hello")
    result = sandbox.run(
        py("import os; print(open('in.txt').read(), os.getcwd()); open('out.txt', 'w').write('x')"), tmp_path
    )
    assert (result.exit_code, result.timed_out, result.survivors) == (0, False, 0)
    assert result.stdout.split() == ["hello", str(tmp_path)]
    assert (tmp_path / "out.txt").read_text() == "x"
    assert set(result.summary()) == {"exit_code", "timed_out", "survivors", "guards", "disk_full"}
    assert set(result.guards) >= {"network", "memory", "processes", "writes"}


def test_infinite_loop_is_killed_at_the_timeout(tmp_path):
    started = time.monotonic()
    result = sandbox.run(py("while True: pass"), tmp_path, QUICK)
    assert result.timed_out and result.exit_code is None and result.survivors == 0
    assert time.monotonic() - started < 15


def test_children_that_escape_the_process_group_die_too(tmp_path):
    # setsid puts the sleeper in its own session: killing the process group alone would miss it
    result = sandbox.run(["sh", "-c", "setsid sleep 300 & setsid sh -c 'sleep 300' & sleep 300"], tmp_path, QUICK)
    assert result.timed_out and result.survivors == 0


def test_fork_bomb_is_capped(tmp_path):
    need("processes")
    bomb = "import os, time\nfor i in range(200):\n    if os.fork() == 0:\n        time.sleep(60); os._exit(0)\n"
    result = sandbox.run(py(bomb), tmp_path, QUICK)
    assert result.exit_code != 0 and "Resource temporarily unavailable" in result.stderr
    assert result.survivors == 0


def test_the_runs_cgroups_are_children_of_the_callers_own():
    need("processes")
    own = {}  # controller ("" for v2) -> this process's cgroup path
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own |= {controller: path.lstrip("/") for controller in controllers.split(",")}
    group = sandbox._Cgroup.create("test-nesting", QUICK)  # what `run` makes, and removes after the run
    try:
        for folder in group.dirs:  # one at the root would leave the caller's memory limit (here a v1 memory cgroup)
            controller = (
                ""
                if (sandbox.CGROUP_ROOT / "cgroup.controllers").is_file()
                else folder.relative_to(sandbox.CGROUP_ROOT).parts[0]
            )
            assert folder.parent == sandbox.CGROUP_ROOT / controller / own[controller], own
    finally:
        group.remove()


def test_memory_bomb_fails_inside(tmp_path):
    result = sandbox.run(py("x = bytearray(4 * 1024**3); print('allocated')"), tmp_path, QUICK)
    assert result.exit_code != 0 and "MemoryError" in result.stderr and "allocated" not in result.stdout
    assert result.guards["memory"].startswith("rlimit_as")


def test_a_run_that_adds_past_the_cap_fails_and_loses_only_what_it_wrote(tmp_path):
    (tmp_path / "kept.py").write_text("x" * 3 * 1024**2)  # the project's own file, alone over the cap: never removed
    small = sandbox.run(py("open('small.txt', 'w').write('x')"), tmp_path, Limits(wall_seconds=10, workspace_mb=2))
    assert small.exit_code == 0 and not small.disk_full  # the cap is on what the run adds
    fill = "for i in range(6):\n    open(f'blob{i}.bin', 'wb').write(bytes(512 * 1024))\n"  # 3 MiB
    result = sandbox.run(py(fill), tmp_path, Limits(wall_seconds=10, workspace_mb=2))
    assert result.exit_code == 0 and result.disk_full
    assert f"the run added {6 * 512 * 1024} bytes to the workspace, over the 2 MiB" in result.stderr
    added = sum(p.stat().st_size for p in tmp_path.glob("blob*"))
    assert 0 < added <= 2 * 1024**2 and (tmp_path / "kept.py").stat().st_size == 3 * 1024**2
    assert (tmp_path / "small.txt").exists()  # written before this run
    assert not sandbox.run(py(fill), tmp_path, Limits(wall_seconds=10, workspace_mb=4)).disk_full  # under the cap


LOCKED_FOLDERS = """import sys
from pathlib import Path
from harnessrl.envs.code import sandbox
workspace = Path(sys.argv[1])
# 3 MiB in a folder made unreadable, a file in one made unsearchable: hidden from the cap, or a crash of its listing
command = ["sh", "-c", "mkdir d e && head -c 3145728 /dev/zero > d/f && touch e/x && chmod 000 d && chmod 400 e"]
result = sandbox.run(command, workspace, sandbox.Limits(wall_seconds=10, workspace_mb=1))
print(result.exit_code, result.disk_full, sorted(str(p.relative_to(workspace)) for p in workspace.rglob("*")))
"""


def test_folders_a_run_locks_are_opened_again_and_counted(tmp_path):
    assert as_a_user(LOCKED_FOLDERS, tmp_path).split(" ", 2) == ["0", "True", "['d', 'e', 'e/x']\n"]


def test_reopening_gives_rights_to_folders_never_through_links(tmp_path):
    workspace, outside = tmp_path / "w", tmp_path / "outside"
    (workspace / "locked").mkdir(parents=True)
    (workspace / "locked" / "f").write_bytes(b"xyz")
    outside.mkdir()
    (workspace / "link").symlink_to(outside, target_is_directory=True)
    outside.chmod(0o500)
    (workspace / "locked").chmod(0o000)
    try:
        found = sandbox.listing(workspace, reopen_since=0)
        assert found == {str(workspace / "locked" / "f"): (3, (workspace / "locked" / "f").stat().st_mtime_ns)}
        assert (workspace / "locked").stat().st_mode & 0o777 == 0o700
        assert outside.stat().st_mode & 0o777 == 0o500  # the link's target is left as it was
    finally:
        outside.chmod(0o700)
        (workspace / "locked").chmod(0o700)


def test_writes_outside_the_workspace_fail(tmp_path):
    need("writes")
    outside = Path(__file__).with_name("pwned.txt")  # the project's own tree
    code = f"open({str(outside)!r}, 'w').write('pwned')"
    result = sandbox.run(py(code), tmp_path, QUICK)
    assert result.exit_code != 0 and ("Read-only file system" in result.stderr or "No such file" in result.stderr)
    assert not outside.exists()
    # /tmp inside is private: a write beside the workspace (here under /tmp) lands there and is gone after
    beside = tmp_path.parent / f"{tmp_path.name}-beside.txt"
    assert sandbox.run(py(f"open({str(beside)!r}, 'w').write('x')"), tmp_path, QUICK).exit_code == 0
    assert not beside.exists()


def test_files_outside_the_system_folders_are_out_of_reach(tmp_path):
    need("reads")
    secret = Path(__file__)  # the project's tree stands for a task folder with hidden tests
    result = sandbox.run(py(f"print(open({str(secret)!r}).read())"), tmp_path, QUICK)
    assert result.exit_code != 0 and "No such file" in result.stderr and "secret" not in result.stdout


def test_an_installed_harnessrl_is_hidden_with_its_reference_solutions(tmp_path, monkeypatch):
    need("reads")
    package = Path(sandbox.__file__).resolve().parents[2]
    mounted = [*sandbox._system_folders(), str(package.parent)]  # as a site-packages install would be
    monkeypatch.setattr(sandbox, "_system_folders", lambda: mounted)
    library = package / "envs" / "code" / "library"
    assert any(library.glob("*.py"))
    result = sandbox.run(py(f"import os; print(os.listdir({str(package)!r}))"), tmp_path, QUICK)
    assert result.exit_code == 0 and result.stdout.strip() == "[]", result


def test_no_network_even_to_this_machines_loopback(tmp_path):
    need("network")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True).start()
    result = sandbox.run(
        py(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"), tmp_path, QUICK
    )
    assert result.exit_code != 0 and ("ConnectionRefusedError" in result.stderr or "OSError" in result.stderr)
    time.sleep(0.2)
    server.close()
    assert accepted in ([], [None])


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


def test_degraded_guards_are_reported(tmp_path, monkeypatch, caplog):
    # a machine without bubblewrap, unshare or writable cgroups: the command still runs, every missing guard says "off"
    monkeypatch.setattr(sandbox, "_bwrap_works", lambda: False)
    monkeypatch.setattr(sandbox, "_unshare_works", lambda: False)
    monkeypatch.setattr(sandbox, "CGROUP_ROOT", tmp_path / "no-cgroups")
    sandbox._warn_once.cache_clear()
    with caplog.at_level("WARNING"):
        result = sandbox.run(["sh", "-c", "echo ok; sleep 300 & sleep 300"], tmp_path, Limits(wall_seconds=2))
    assert result.guards == {
        "network": "off",
        "writes": "off",
        "reads": "off",
        "memory": "rlimit_as",
        "processes": "off",
    }
    assert result.stdout.strip() == "ok" and result.timed_out and result.survivors == 0
    assert "degraded guards ['network', 'processes', 'reads', 'writes']" in caplog.text


def test_missing_workspace_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        sandbox.run(["true"], tmp_path / "nope")
