"""Run one command in a sandbox: no network, writes only inside the workspace, limits on wall-clock
time, CPU time, memory and processes, and the whole process tree killed when it ends.

Each guard uses the best mechanism the machine allows and is reported by name in
`SandboxResult.guards` ("off" where the kernel or the machine denies it, logged once as degraded):

| guard | mechanism | without it |
|---|---|---|
| network | bubblewrap `--unshare-net`: a network namespace with only its own loopback | `unshare --net` (util-linux), else off |
| writes | bubblewrap: the workspace read-write, a private `/tmp`, no capabilities (user namespace, uid 1000) | off |
| reads | bubblewrap: only system folders and this Python are mounted (read-only), never other files of the machine; harnessrl's own package (its reference solutions) hidden under an empty tmpfs where it is installed there | off |
| memory | `RLIMIT_AS` (prlimit), plus the memory cgroup's limit where cgroups are writable (a child of the caller's own cgroup) | rlimit only |
| processes | the pids cgroup's `pids.max` | off (`RLIMIT_NPROC` does not bind root) |

CPU time is always capped (`RLIMIT_CPU`) and file size (`RLIMIT_FSIZE`); `Limits.workspace_mb` caps what the
run adds to the workspace: measured after the run against a listing taken before it, over the cap the files the
run wrote (new or changed) are removed, largest first, never the others, and `disk_full` is set (the disk is not
capped during the run: no quota). The command runs in its own
session inside a PID namespace (`--unshare-pid --die-with-parent`); when it ends or times out every
process of its cgroup, its process group, and any process carrying its marker in the environment is
killed, and `survivors` counts those still alive a second later (0 is the contract).

This module knows nothing about tasks, tests or rewards.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)
CGROUP_ROOT = Path("/sys/fs/cgroup")
_OUTPUT_LIMIT = 64_000  # characters of stdout / stderr kept (the tail)
_STDIN_BYTES = 4096  # one page: what a pipe holds even where the user's pipe buffers are capped
WORKSPACE_MB = 256  # the coding agent's workspace cap (`Limits.workspace_mb`): many 64 MiB files fill a disk


@dataclass(frozen=True)
class Limits:
    wall_seconds: float = 30.0
    cpu_seconds: int = 30
    memory_mb: int = 1024
    processes: int = 64
    file_mb: int = 64
    workspace_mb: int | None = None  # what the run may add, checked after it, the excess removed; None: unchecked

    def __post_init__(self) -> None:  # a limit of 0 or below (or a NaN timeout) turned its guard off or ran nothing
        if not (math.isfinite(self.wall_seconds) and self.wall_seconds > 0):
            raise ValueError(f"timeout {self.wall_seconds}: a finite number of seconds above 0")
        for name in ("cpu_seconds", "memory_mb", "processes", "file_mb", "workspace_mb"):
            if (value := getattr(self, name)) is not None and value < 1:
                raise ValueError(f"{name.replace('_', '-')} {value}: at least 1")


@dataclass
class SandboxResult:
    exit_code: int | None  # None: killed at the timeout
    timed_out: bool
    survivors: int
    guards: dict[str, str]
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    disk_full: bool = False  # the run added over `workspace_mb` to the workspace (what it wrote was removed)

    def summary(self) -> dict:
        """The line `harnessrl sandbox` prints last."""
        keys = ("exit_code", "timed_out", "survivors", "guards", "disk_full")
        return {k: v for k, v in asdict(self).items() if k in keys}


def run(
    command: list[str],
    workspace: Path,
    limits: Limits = Limits(),
    env: dict[str, str] | None = None,
    stdin: str = "",
    read_only: Sequence[Path] = (),
) -> SandboxResult:
    """Run `command` with `workspace` as its working directory (and the only place it may write).

    `stdin` is its standard input; `read_only` folders are visible inside even under /tmp (which is private)."""
    workspace = Path(workspace).resolve()
    if not workspace.is_dir():
        raise FileNotFoundError(f"{workspace}: the workspace is not a directory")
    if len(given := stdin.encode()) > _STDIN_BYTES:
        raise ValueError(f"stdin: {len(given)} bytes, over the {_STDIN_BYTES} a pipe always holds unread")
    marker = uuid.uuid4().hex
    cgroup = _Cgroup.create(marker, limits)
    isolation, guards = _isolation(workspace, [Path(p).resolve() for p in read_only])
    rlimits = _prlimit(limits)
    guards["memory"] = "+".join(["rlimit_as"] * bool(rlimits) + ["cgroup"] * bool(cgroup)) or "off"
    guards["processes"] = "cgroup_pids" if cgroup else "off"
    _warn_degraded(guards)
    argv = [*_cgroup_join(cgroup), *rlimits, *isolation, *command]
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workspace),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        **(env or {}),
        "HARNESSRL_SANDBOX": marker,
    }
    before = listing(workspace) if limits.workspace_mb else {}  # the cap is on what the run adds
    started = time.monotonic()
    since = time.time_ns() - 1_000_000_000  # a second early: ctimes come from the kernel's coarse clock
    # stdin is a pipe, not a file: once the command has read it, it is empty for code that opens it again
    # through /proc/1/fd/0 (bwrap's init keeps a copy; the scoring run's nonce travels there)
    reader, writer = os.pipe()
    os.write(writer, given)
    os.close(writer)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(
                argv, cwd=workspace, env=environment, stdin=reader, stdout=out, stderr=err, start_new_session=True
            )
        finally:
            os.close(reader)
        timed_out = False
        try:
            exit_code: int | None = process.wait(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out, exit_code = True, None
        survivors = _kill_tree(process, marker, cgroup)
        seconds = time.monotonic() - started
        stdout, stderr = _tail(out), _tail(err)
    if cgroup:
        cgroup.remove()
    grown = _trim_workspace(workspace, before, limits.workspace_mb * 1024**2, since) if limits.workspace_mb else 0
    if grown:
        stderr += f"\nsandbox: the run added {grown} bytes to the workspace, over the {limits.workspace_mb} MiB it may "
        stderr += "add: files it wrote were removed, largest first"
    return SandboxResult(exit_code, timed_out, survivors, guards, stdout, stderr, seconds, disk_full=bool(grown))


def listing(workspace: Path, reopen_since: int | None = None) -> dict[str, tuple[int, int]]:
    """Each file under the workspace (links never followed, not even read): its size and modification time.
    A folder it cannot list is an error, never skipped (its files would escape the workspace cap). With
    `reopen_since` (ns, a run's start), a folder changed since then that its owner may not list is opened again
    for the owner first: where not root, a run that locked a folder hid what it wrote, or crashed the listing.
    Each name is read relative to its folder's open descriptor (`os.fwalk`), so a folder swapped for a link while
    the walk runs (by a process that outlived the run) neither leads it outside nor gets the owner's rights."""
    found = {}
    if reopen_since is not None:
        _reopen(str(workspace), reopen_since)
    for folder, dirs, names, fd in os.fwalk(workspace, onerror=_raise):  # top-down: reopened before listed
        for name in dirs if reopen_since is not None else ():
            _reopen(name, reopen_since, fd)
        for name in names:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            found[os.path.join(folder, name)] = (info.st_size, info.st_mtime_ns)
    return found


def _reopen(path: str, since: int, folder: int | None = None) -> None:
    """Owner rwx on a folder (never a link) changed since `since` that lacks it: only what the run itself locked.
    `folder`: the descriptor `path` is relative to. The folder is opened (O_PATH, no rights needed, a link refused)
    and changed through that descriptor, so what is checked is what is changed."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=folder)
    except NotADirectoryError:  # a file, or a link put where the walk saw a folder
        return
    try:
        info = os.fstat(fd)
        if info.st_ctime_ns >= since and info.st_mode & stat.S_IRWXU != stat.S_IRWXU:
            os.chmod(f"/proc/self/fd/{fd}", info.st_mode | stat.S_IRWXU)  # fchmod refuses an O_PATH descriptor
    finally:
        os.close(fd)


def _raise(error: OSError) -> None:
    raise error


def _trim_workspace(workspace: Path, before: dict[str, tuple[int, int]], cap: int, since: int) -> int:
    """The bytes the run added to the workspace (its `before` listing) where over `cap` (0 otherwise), after
    removing the files the run wrote (new or changed: a project file the run rewrote among them), largest first,
    until it is under the cap: files the run left untouched are never removed, even where they alone pass the cap."""
    after = listing(workspace, reopen_since=since)  # folders the run locked opened again (where not root)
    grown = added = sum(size for size, _ in after.values()) - sum(size for size, _ in before.values())
    if grown <= cap:
        return 0
    written = sorted(((size, path) for path, (size, mtime) in after.items() if before.get(path) != (size, mtime)))
    for size, path in reversed(written):  # the largest first
        try:
            os.unlink(path)
            added -= size
        except OSError:  # a folder the run made read-only (where not root): the next file
            continue
        if added <= cap:
            break
    return grown


# ---- isolation -------------------------------------------------------------------------------------


def _isolation(workspace: Path, read_only: list[Path]) -> tuple[list[str], dict[str, str]]:
    """The argv prefix that isolates the command, and the network / writes guards it gives."""
    if _bwrap_works():
        return _bwrap_argv(workspace, read_only), {"network": "netns", "writes": "bwrap", "reads": "system_only"}
    if _unshare_works():
        unshare = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--"]
        return unshare, {"network": "netns", "writes": "off", "reads": "off"}
    return [], {"network": "off", "writes": "off", "reads": "off"}


def _bwrap_argv(workspace: Path, read_only: list[Path]) -> list[str]:
    # /tmp first: a Python (a venv) or a workspace under /tmp is mounted over the private /tmp, not hidden by it
    system = [arg for folder in _system_folders() for arg in ("--ro-bind-try", folder, folder)]
    hidden = [arg for folder in _hidden_folders() for arg in ("--tmpfs", folder)]
    shown = [arg for folder in read_only for arg in ("--ro-bind", str(folder), str(folder))]
    return [
        "bwrap", "--tmpfs", "/tmp", *system, *hidden, "--dev", "/dev", "--proc", "/proc", *shown,
        "--bind", str(workspace), str(workspace), "--chdir", str(workspace),
        "--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000",
        "--die-with-parent", "--new-session", "--",
    ]  # fmt: skip


def _system_folders() -> list[str]:
    """What a command needs to run (system folders, this Python and its packages): nothing of the
    user's own files, the task folders or their hidden tests."""
    python = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).resolve().parents[1])}
    return ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", *sorted(python)]


def _hidden_folders() -> list[str]:
    """harnessrl's own package where it lies inside a mounted folder (installed into site-packages, not
    editable): the code tasks' reference library and tests ship in it and must stay out of reach."""
    package = Path(__file__).resolve().parents[2]
    hidden = []  # under every mount it shows through (/lib -> usr/lib mounts /usr/lib twice)
    for folder in _system_folders():
        if package.is_relative_to(real := Path(folder).resolve()):
            hidden.append(str(Path(folder) / package.relative_to(real)))
    return sorted(set(hidden))


@functools.cache
def _bwrap_works() -> bool:
    if not shutil.which("bwrap"):
        return False
    with tempfile.TemporaryDirectory() as workspace:  # the argv `run` uses (where /proc cannot be mounted, it fails)
        probe = [*_bwrap_argv(Path(workspace), []), "true"]
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


@functools.cache
def _unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--", "true"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def _warn_degraded(guards: dict[str, str]) -> None:
    off = sorted(name for name, how in guards.items() if how == "off")
    if off:
        _warn_once(
            f"sandbox: degraded guards {off} (install bubblewrap, allow user namespaces, make cgroups writable: "
            "docs/code.md)"
        )


def _prlimit(limits: Limits) -> list[str]:
    if not shutil.which("prlimit"):  # util-linux; without it neither memory nor CPU time is capped
        _warn_once("sandbox: no prlimit (util-linux): no memory, CPU-time or file-size limit")
        return []
    mb = 1024 * 1024
    return [
        "prlimit", f"--as={limits.memory_mb * mb}", f"--cpu={limits.cpu_seconds}",
        f"--fsize={limits.file_mb * mb}", "--core=0", "--",
    ]  # fmt: skip


# ---- cgroups and the tree kill ---------------------------------------------------------------------


class _Cgroup:
    """A fresh cgroup with pids.max and a memory limit: one directory per controller (v1) or one (v2), each a
    child of the caller's own cgroup (one at the hierarchy's root would leave the caller's memory limit)."""

    def __init__(self, dirs: list[Path]):
        self.dirs = dirs

    @classmethod
    def create(cls, name: str, limits: Limits) -> _Cgroup | None:
        memory = str(limits.memory_mb * 1024 * 1024)
        try:
            if (CGROUP_ROOT / "cgroup.controllers").is_file():  # v2: one tree
                parent = own_cgroup("")
                try:
                    (parent / "cgroup.subtree_control").write_text("+pids +memory")
                except OSError as exc:  # the root's children then, as before: outside the caller's memory limit
                    _warn_once(
                        f"sandbox: this process's cgroup {parent} cannot have children with pids and memory limits "
                        f"({exc.strerror}: under cgroup v2 only a cgroup holding no process can), so the runs' cgroups "
                        f"go under {CGROUP_ROOT / 'harnessrl'}, outside this process's memory limit"
                    )
                    parent = CGROUP_ROOT / "harnessrl"
                    parent.mkdir(exist_ok=True)
                    (CGROUP_ROOT / "cgroup.subtree_control").write_text("+pids +memory")
                    (parent / "cgroup.subtree_control").write_text("+pids +memory")
                group = parent / f"harnessrl-{name}"
                group.mkdir()
                (group / "pids.max").write_text(str(limits.processes))
                (group / "memory.max").write_text(memory)
                return cls([group])
            pids, mem = (own_cgroup(controller) / f"harnessrl-{name}" for controller in ("pids", "memory"))
            for group in (pids, mem):
                group.mkdir()  # FileNotFoundError where the controller is not mounted
                if not (group / "cgroup.procs").is_file():  # a plain directory, not a cgroup file system
                    group.rmdir()
                    raise OSError(f"{group.parent} is not a cgroup hierarchy")
            (pids / "pids.max").write_text(str(limits.processes))
            (mem / "memory.limit_in_bytes").write_text(memory)
            return cls([pids, mem])
        except OSError as exc:
            _warn_once(f"sandbox: no cgroup ({exc}); processes unlimited, memory by rlimit only")
            return None

    def pids(self) -> set[int]:
        procs = self.dirs[0] / "cgroup.procs"
        return {int(p) for p in procs.read_text().split()} if procs.is_file() else set()

    def remove(self) -> None:
        for group in self.dirs:
            try:
                group.rmdir()
            except OSError as exc:  # still populated: the survivors were reported
                log.warning("sandbox: cgroup %s left behind: %s", group, exc)


def own_cgroup(controller: str) -> Path:
    """This process's cgroup folder for a v1 `controller`, or in the v2 tree (""), from /proc/self/cgroup; the
    mount's root where that path is not under it (a container that mounts its own cgroup as the root)."""
    mount = CGROUP_ROOT / controller
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controller in controllers.split(",")) if controller else controllers == "":
            return own if (own := mount / path.lstrip("/")).is_dir() else mount
    raise OSError(f"/proc/self/cgroup names no {controller or 'v2'} cgroup of this process")


def _cgroup_join(cgroup: _Cgroup | None) -> list[str]:
    """A shell that moves itself into the cgroup, then execs the rest of the argv (so all its children are in it)."""
    if cgroup is None:
        return []
    join = " ".join(f"echo $$ > '{group / 'cgroup.procs'}';" for group in cgroup.dirs)
    return ["/bin/sh", "-c", f'{join} exec "$@"', "sandbox"]


def _kill_tree(process: subprocess.Popen, marker: str, cgroup: _Cgroup | None) -> int:
    """SIGKILL the command's session, cgroup and marked processes until none is left; how many survive 1 s."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        members = _members(marker, cgroup)
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.poll()
        if not members or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    process.wait()
    return len(_members(marker, cgroup))


def _members(marker: str, cgroup: _Cgroup | None) -> set[int]:
    """Live processes of the sandbox: its cgroup's, and those whose environment carries its marker."""
    found = cgroup.pids() if cgroup else set()
    needle = f"HARNESSRL_SANDBOX={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in found:
            continue
        try:
            if needle in (entry / "environ").read_bytes() and _alive(entry):
                found.add(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return {pid for pid in found if _alive(Path(f"/proc/{pid}"))}


def _alive(proc: Path) -> bool:
    """A process that exists and is not a zombie waiting to be reaped."""
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _tail(file) -> str:
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(max(0, size - _OUTPUT_LIMIT * 4))
    return file.read().decode("utf-8", errors="replace")[-_OUTPUT_LIMIT:]
