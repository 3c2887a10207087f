"""``serve`` and ``sim-engine`` grow their file-descriptor table at startup, not in their first burst.

Linux reports a process's table size as ``FDSize`` in ``/proc/PID/status``. In a process with
threads, each doubling of that table waits for an RCU grace period inside the ``accept()`` that
needed it; done during the first burst it held the event loop for ~15 ms (docs/performance.md,
"Burst: a cached-prefix follow-up among 256 arrivals").
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.servers import start_frontend, start_sim_engine

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="FDSize is read from Linux's /proc"
)


def fd_table_size(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("FDSize:"):
            return int(line.split()[1])
    raise AssertionError("no FDSize line")


def test_reserving_grows_the_table_and_leaves_no_descriptor_open() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        from deepseek_frontend._descriptors import reserve_descriptor_table
        from tests.reliability.test_descriptor_table import fd_table_size

        before_size, before_open = fd_table_size(), sorted(os.listdir("/proc/self/fd"))
        busy = os.open(os.devnull, os.O_RDONLY)
        os.dup2(busy, 300)  # a descriptor in use where a small reservation would end
        assert reserve_descriptor_table(301) == 300
        assert os.fstat(300) is not None, "a descriptor in use is left alone"
        os.close(300)
        os.close(busy)
        highest = reserve_descriptor_table(5000)
        assert highest == 4999, highest
        assert fd_table_size() >= 5000 > before_size, (before_size, fd_table_size())
        assert sorted(os.listdir("/proc/self/fd")) == before_open
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, cwd=Path(__file__).parents[2])


def grown_to(pid: int, wanted: int) -> bool:
    """The process's table holds ``wanted`` descriptors, or as many as its open-files limit allows."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            limit = wanted if soft == "unlimited" else min(wanted, int(soft))
            return fd_table_size(pid) >= limit
    raise AssertionError("no open-files limit line")


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a process that ended meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_serve_and_the_sim_engine_start_with_their_tables_grown() -> None:
    with start_sim_engine() as engine:
        assert grown_to(engine.proc.pid, 8192)
        with start_frontend("--worker", engine.url, "--max-connections", "3000") as frontend:
            # 3,000 client connections, a quarter more for engine connections, 1,024 for files
            assert grown_to(frontend.proc.pid, 3000 + 750 + 1024)
        # --workers 2: a forked process starts with a small table again, so each grows its own
        with start_frontend(
            "--worker", engine.url, "--max-connections", "3000", "--workers", "2"
        ) as frontend:
            children = children_of(frontend.proc.pid)
            assert len(children) == 2, children
            assert all(grown_to(pid, 3000 + 750 + 1024) for pid in children)
