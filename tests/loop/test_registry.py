"""The model registry: immutable versions, atomic promote, rollback history, crash leftovers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from harnessrl.loop.registry import Registry, RegistryError, VersionInfo


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
