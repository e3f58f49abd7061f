"""Store URLs for the loop's tests: SQLite always, and a real PostgreSQL server where one can be started.

PostgreSQL: the Debian package's binaries (initdb, pg_ctl), a throwaway cluster in a temporary
folder on a free 127.0.0.1 port, run as the `postgres` user when the tests run as root. Skipped
where there is no PostgreSQL, unless HARNESSRL_REQUIRE_POSTGRES=1 (CI), where that is a failure.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest


def _binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return os.path.dirname(found[-1]) if found else None


def _as_owner(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@pytest.fixture(scope="session")
def postgres_url():
    bin_dir = _binaries()
    if bin_dir is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        if os.environ.get("HARNESSRL_REQUIRE_POSTGRES") == "1":
            pytest.fail("HARNESSRL_REQUIRE_POSTGRES=1 but no PostgreSQL server binaries (apt-get install postgresql)")
        pytest.skip("no PostgreSQL server binaries here (the Debian package postgresql)")
    folder = tempfile.mkdtemp(prefix="harnessrl-pg-")
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    data = os.path.join(folder, "data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = lambda *cmd: subprocess.run(_as_owner(list(cmd)), check=True, capture_output=True, text=True)  # noqa: E731
    run(f"{bin_dir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=on"
    run(f"{bin_dir}/pg_ctl", "-D", data, "-o", options, "-l", os.path.join(folder, "log"), "-w", "start")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        run(f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "stop")
        time.sleep(0.2)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "traces.db")
    url = request.getfixturevalue("postgres_url")
    # a fresh schema per test: drop what the previous test left
    import sqlalchemy as sa

    from harnessrl.loop.store import Store

    store = Store(url)
    with store.engine.begin() as db:
        for table in ("feedback", "calls", "traces", "episodes"):
            db.execute(sa.text(f"DELETE FROM {table}"))
    store.close()
    return url
