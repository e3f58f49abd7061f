"""The model registry: immutable versions, atomic promote, rollback history, crash leftovers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.loop.registry import Registry, RegistryError, VersionInfo
from tests.conftest import cli


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry.create(tmp_path_factory.mktemp("reg") / "registry", "weather")
    for seed in (0, 1, 2):
        reg.add_model("tiny", seed)
    return reg


def test_versions_are_numbered_and_load_with_their_number(registry):
    assert [v.id for v in registry.versions()] == ["weather@v1", "weather@v2", "weather@v3"]
    assert registry.resolve("2") == registry.resolve("v2") == "weather@v2"
    policy = registry.load("v3")
    assert policy.name == "weather" and policy.version == 3
    policy.close()
    with pytest.raises(RegistryError, match="expected weather@vN"):
        registry.resolve("other@v1")
    with pytest.raises(RegistryError, match=r"no version 'weather@v9' .*versions: weather@v1"):
        registry.info("v9")


def test_promote_and_rollback_walk_the_history(registry):
    assert registry.promoted() is None
    registry.promote("v1", reason="first")
    registry.promote("v2", reason="x")
    registry.promote("v3", reason="y")
    assert registry.rollback() == ("weather@v3", "weather@v2")
    assert registry.rollback() == ("weather@v2", "weather@v1")
    with pytest.raises(RegistryError, match="nothing to roll back to"):
        registry.rollback()
    assert registry.promoted() == "weather@v1"
    kinds = [e["event"] for e in registry.events()]
    assert kinds == ["promote", "promote", "promote", "rollback", "rollback"]
    registry.promote("v3", reason="again")  # a version rolled back from and promoted again is history again
    registry.promote("v2", reason="z")
    assert registry.rollback() == ("weather@v2", "weather@v3")
    assert registry.rollback() == ("weather@v3", "weather@v1")


def test_a_rollback_killed_before_its_log_line_is_not_undone_by_the_next(registry, tmp_path):
    reg = Registry.create(tmp_path / "registry", "weather")
    shutil.copytree(registry.root / "versions", reg.root / "versions", dirs_exist_ok=True)
    for version in ("v1", "v2", "v3"):
        reg.promote(version, reason="x")
    (reg.root / "PROMOTED").write_text("weather@v2\n")  # rollback() switched PROMOTED, then the kill
    assert reg.rollback() == ("weather@v2", "weather@v1")  # on down the history, not back up to v3
    assert reg.promoted() == "weather@v1"
    # replayed, the rerun walked back past v2 as well: two rollbacks, two promotions undone, none left
    assert reg.promotions() == ["weather@v1"]
    with pytest.raises(RegistryError, match="nothing to roll back to"):
        reg.rollback()  # not back up to v3, the version rolled away from


def test_versions_are_immutable_and_staging_is_cleaned(registry):
    info = VersionInfo(id="weather@v2", number=2)
    with pytest.raises(RegistryError, match="immutable"):
        registry.add(lambda folder: (folder / "config.json").write_text("{}"), info)
    assert registry.clean_staging() == [".staging-weather@v2"]  # what the refused write left
    assert not list(registry.root.glob(".staging-*"))


def test_a_torn_event_line_is_skipped_and_the_next_event_kept(registry):
    with open(registry.root / "events.jsonl", "a") as f:
        f.write('{"event": "promote", "vers')  # a crash mid-append
    assert registry.events()[-1]["event"] == "rollback"
    registry.log("cycle", version=None)  # starts a line of its own, not glued to the torn one
    assert [e["event"] for e in registry.events()[-2:]] == ["rollback", "cycle"]
    lines = (registry.root / "events.jsonl").read_text().splitlines()
    assert lines[-2] == '{"event": "promote", "vers'
    (registry.root / "events.jsonl").write_text("\n".join(lines[:-2]) + "\n")
    assert json.loads(lines[0])["event"] == "promote"


def test_a_registry_needs_its_file(tmp_path):
    with pytest.raises(RegistryError, match="not a registry"):
        Registry(tmp_path)
    Registry.create(tmp_path / "r", "a")
    with pytest.raises(RegistryError, match="already a registry of 'a'"):
        Registry.create(tmp_path / "r", "b")
    for damaged, said in (('{"name": "a"', "JSONDecodeError"), ("[]", "TypeError"), ("{}", "KeyError: 'name'")):
        (tmp_path / "r" / "registry.json").write_text(damaged)
        with pytest.raises(RegistryError, match=f"r/registry.json: expected .*{said}"):
            Registry(tmp_path / "r")


def test_a_version_json_cut_short_or_edited_by_hand_is_named(tmp_path):
    reg = Registry.create(tmp_path / "r", "a")
    reg.add_model("tiny", 0)
    path = reg.path("v1") / "version.json"
    path.write_text(path.read_text()[:40])
    for read in (reg.versions, lambda: reg.info("v1")):
        with pytest.raises(RegistryError, match=r"versions/a@v1/version.json: version.json: Invalid JSON"):
            read()
    for args in (("registry", tmp_path / "r"), ("report", "--registry", tmp_path / "r")):
        done = cli(*args)
        assert done.exit_code == 2 and "version.json" in done.stderr, (args, done.output)
    page = cli("report", "--registry", tmp_path / "r", "--out", tmp_path / "notes.txt")  # never over a non-page
    assert page.exit_code == 2 and "an .html file" in page.stderr


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names an fd's file through /proc")
def test_a_version_is_on_disk_folders_included_before_its_rename(tmp_path, monkeypatch):
    reg = Registry.create(tmp_path / "registry", "weather")
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd))[1])

    def write(folder: Path) -> None:
        (folder / "adapter").mkdir()
        (folder / "adapter" / "weights.bin").write_bytes(b"w")

    reg.add(write, VersionInfo(id="weather@v1", number=1))
    staging = str((reg.root / ".staging-weather@v1").resolve())
    wanted = {staging, f"{staging}/adapter", f"{staging}/adapter/weights.bin", f"{staging}/version.json"}
    assert wanted <= set(synced), sorted(wanted - set(synced))
    assert str((reg.root / "versions").resolve()) in synced  # the rename itself


def _written(reg: Registry, number: int, decision: dict, source: str | None = None) -> str:
    """A version by hand (the listing reads no weights)."""
    parent = None if source else f"weather@v{number - 1}"
    info = VersionInfo(id=f"weather@v{number}", number=number, parent=parent, source=source, decision=decision)
    reg.add(lambda folder: (folder / "config.json").write_text("{}"), info)
    return info.id


def test_the_listing_shows_the_final_decision_of_each_cycle_and_each_reason(tmp_path):
    reg = Registry.create(tmp_path / "registry", "weather")
    reg.promote(_written(reg, 1, {"added": True}, source="tiny-base"), reason="first")
    moved = {"promote": False, "reasons": ["PROMOTED moved to weather@v1 during the cycle"]}
    passed = {"promote": True, "reasons": []}
    reg.log("cycle", version=_written(reg, 2, passed), decision=moved)  # version.json keeps the gate's decision
    reasons = [
        "the candidate finished 0% of its episodes (min_finished 50%): its scores are of failures",
        "canary failed_share failed",
    ]
    failing = {"promote": False, "reasons": reasons}
    reg.log("cycle", version=_written(reg, 3, failing), decision=failing)
    bound = {"promote": False, "reasons": ["paired lower bound -0.200 <= -margin -0.020"]}
    reg.log("cycle", version=_written(reg, 4, bound), decision=bound)
    done = cli("registry", reg.root)
    assert done.exit_code == 0, done.output
    rows = {cells[1].strip(" *"): line for line in done.output.splitlines() if len(cells := line.split("│")) > 2}
    assert "passed" not in rows["weather@v2"] and "refused: PROMOTED moved" in rows["weather@v2"]
    assert "refused: min_finished, failed_share" in rows["weather@v3"]
    assert "refused: bound" in rows["weather@v4"]


def test_create_run_again_adds_nothing(tmp_path):
    root = tmp_path / "registry"
    for _ in range(2):
        done = cli("registry", root, "--create", "weather", "--model", "tiny")
        assert done.exit_code == 0, done.output
    assert "weather@v1 is from tiny; nothing added" in done.output
    assert json.loads(done.stdout.splitlines()[-1])["versions"] == ["weather@v1"]
    other = cli("registry", root, "--create", "weather", "--model", "tiny-base")
    assert other.exit_code == 2 and "holds weather@v1; to add a version from tiny-base, drop --create" in other.output
    assert [v.id for v in Registry(root).versions()] == ["weather@v1"]


def test_promote_rollback_and_the_listing_never_import_torch(registry, tmp_path):
    """An operator's rollback answers in about a second: it reads and writes the registry's files only."""
    code = (
        "import sys\nfrom harnessrl.cli import app\n"
        "for args in (['registry', sys.argv[1]], ['promote', 'v2', '--registry', sys.argv[1]],"
        " ['rollback', '--registry', sys.argv[1]]):\n"
        "    app(args, standalone_mode=False)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'\n"
    )
    copy = Registry(shutil.copytree(registry.root, tmp_path / "registry"))
    done = subprocess.run([sys.executable, "-c", code, str(copy.root)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["promoted"] == copy.promoted()
