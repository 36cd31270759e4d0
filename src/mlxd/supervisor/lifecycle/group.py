"""A worker group: one model's ranks, joined by mx.distributed, seen by the lifecycle as one
process (docs/scale-out.md).

`spawn_worker` is the lifecycle's spawner: a spec without a group gives a plain WorkerProcess,
one with a group gives a GroupProcess. The group spawns every rank (local ranks as children of
their own, ranks on other hosts through ssh), gives each its peers' addresses, and answers
the WorkerProcess verbs for all of them: its pid is rank 0's (the one serving the socket), a
stop is rank 0's to carry out (it tells its followers to stop in lockstep), and the exit of any
rank ends the whole group, so the lifecycle's crash and restart rules apply to the group.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import signal
import socket
from pathlib import Path

from mlxd.shared.worker_spec import GroupSpec, WorkerSpec
from mlxd.supervisor.lifecycle.process import WorkerProcess

log = logging.getLogger("mlxd.child")

# Ranks on other hosts listen from this port on (mlx.launch's default starting port).
REMOTE_BASE_PORT = 32323
LINK_PORT = 32322  # rank 0's links to its followers, when the ranks are on other hosts
# After rank 0 stopped cleanly, its followers (told to stop in the same step) get this long.
FOLLOWER_GRACE_S = 30.0  # a follower flushes its SSD cache writes first


def spawn_worker(
    model_id: str, argv: list[str], log_path: Path, tail_lines: int = 40
) -> WorkerProcess:
    """The lifecycle's spawner: a GroupProcess when the spec in `argv` names a group."""
    spec = WorkerSpec.from_argv(argv)
    if spec.group is None:
        return WorkerProcess(model_id, argv, log_path, tail_lines)
    return GroupProcess(model_id, spec, log_path, tail_lines)


def rank_specs(spec: WorkerSpec, hosts: list[str]) -> list[WorkerSpec]:
    """Every rank's spec, from rank 0's: `hosts` is one address per rank (local: 127.0.0.1)."""
    group = spec.group
    assert group is not None
    local = all(h == "127.0.0.1" for h in hosts)
    # One port per rank for the backend, and rank 0's links (worker/group/channel.py).
    ports = free_ports(group.size + 1) if local else [*_remote_ports(hosts), LINK_PORT]
    coordinator = f"{hosts[0]}:{ports[0]}"
    link = f"{hosts[0]}:{ports[-1]}"
    nccl = group.backend == "nccl"
    out = []
    for rank in range(group.size):
        g = GroupSpec(
            size=group.size,
            rank=rank,
            backend=group.backend,
            peers=() if nccl else tuple(f"{h}:{p}" for h, p in zip(hosts, ports, strict=False)),
            coordinator=coordinator if nccl else None,
            link=link,
            # NCCL: one GPU per rank, the host's next one (as mlx.launch binds a host's ranks)
            device=hosts[:rank].count(hosts[rank]) if nccl else None,
        )
        update: dict = {"group": g}
        if spec.memory_limit_bytes is not None:
            # The group's share of this host's budget, split between the ranks that share its
            # memory (NCCL ranks each have a GPU of their own: each plans with the whole share);
            # a rank on another host plans with that host's memory.
            sharing = 1 if nccl else hosts.count(hosts[0])
            mine = hosts[rank] == hosts[0]
            update["memory_limit_bytes"] = spec.memory_limit_bytes // sharing if mine else None
        out.append(spec.model_copy(update=update))
    return out


def free_ports(n: int) -> list[int]:
    """`n` loopback ports free now (the ranks bind them a moment later)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _remote_ports(hosts: list[str]) -> list[int]:
    # Ranks sharing a host need ports of their own.
    seen: dict[str, int] = {}
    ports = []
    for h in hosts:
        ports.append(REMOTE_BASE_PORT + seen.get(h, 0))
        seen[h] = seen.get(h, 0) + 1
    return ports


class GroupProcess(WorkerProcess):
    """Every rank of one worker group, with one process's verbs (spawn / terminate / kill /
    reap / stop). The spec's `group.hosts` place the ranks (none: all on this host)."""

    def __init__(self, model_id: str, spec: WorkerSpec, log_path: Path, tail_lines: int = 40):
        assert spec.group is not None
        super().__init__(model_id, spec.to_argv(), log_path, tail_lines)
        self.spec = spec
        self.hosts = list(spec.group.hosts) or ["127.0.0.1"] * spec.group.size
        self.ranks: list[WorkerProcess] = []
        self.failed_rank: int | None = None  # the rank whose exit ended the group
        self._stopping = False
        self._code: int | None = None

    @property
    def pid(self) -> int | None:
        return self.ranks[0].pid if self.ranks else None

    @property
    def pids(self) -> list[int | None]:
        return [p.pid for p in self.ranks]

    @property
    def local_pids(self) -> list[int]:
        """The ranks running on this host (a remote rank's pid is its ssh client's)."""
        return [
            p.pid
            for p, h in zip(self.ranks, self.hosts, strict=False)
            if p.pid is not None and (p is self.ranks[0] or h == "127.0.0.1")
        ]

    def exited(self) -> bool:
        return not self.ranks or any(p.exited() for p in self.ranks)

    @property
    def returncode(self) -> int | None:
        """The group's exit: set once any rank has exited (the group cannot serve then)."""
        if self._code is not None:
            return self._code
        for p in self.ranks:
            if p.returncode is not None:
                return p.returncode
        return None

    async def spawn(self, env=None) -> None:
        specs = rank_specs(self.spec, self.hosts)
        for rank, spec in enumerate(specs):
            path = self.log_path if rank == 0 else self._rank_log(rank)
            argv = spec.to_argv()
            host = self.hosts[rank]
            if rank == 0 or host == "127.0.0.1":
                proc = WorkerProcess(self.model_id, argv, path)
            else:  # ssh joins its arguments into one shell line: quote them
                proc = WorkerProcess(self.model_id, [shlex.quote(a) for a in argv], path)
                proc.command = ["ssh", "-o", "BatchMode=yes", host, "python3", "-u", "-m"]
            try:
                await proc.spawn(env)
            except BaseException:  # (ssh missing, ...): no rank outlives a group that never was
                for p in self.ranks:
                    p.kill()
                raise
            self.ranks.append(proc)
        self.tail = self.ranks[0].tail
        log.info("spawned worker group model=%s ranks=%s", self.model_id, self.pids)

    def _rank_log(self, rank: int) -> Path:
        return self.log_path.with_name(f"{self.log_path.stem}.rank{rank}{self.log_path.suffix}")

    def terminate(self) -> None:
        # Rank 0 drains and tells its followers to stop at the same step.
        self._stopping = True
        if self.ranks:
            self.ranks[0].terminate()

    def kill(self) -> None:
        self._stopping = True
        for p in self.ranks:
            p.kill()

    async def reap(self) -> int:
        """Wait until every rank has exited; the exit of any rank ends the group (the others
        are killed: a group short of a rank can only hang in its next collective)."""
        tasks = [asyncio.create_task(p.reap()) for p in self.ranks]
        first, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        lead = min(tasks.index(t) for t in first)
        code = tasks[lead].result()
        # Stopping, any rank may finish first (a follower has less to tear down).
        clean = code == 0 and self._stopping
        if not clean:
            self.failed_rank = lead
            if lead != 0:
                log.error(
                    "model=%s rank %d exited (%s): ending its group",
                    self.model_id,
                    lead,
                    self.ranks[lead].exit_summary(),
                )
            for p in self.ranks:
                p.kill()
        if pending:
            _, late = await asyncio.wait(pending, timeout=FOLLOWER_GRACE_S)
            for t in late:
                self.ranks[tasks.index(t)].kill()
            await asyncio.gather(*pending, return_exceptions=True)
        # A follower that exits 0 under a serving group still ended it: not a clean stop.
        self._code = code if clean or code != 0 else -signal.SIGKILL
        return self._code

    async def stop(self, timeout_s: float) -> int:
        self.terminate()
        rank0 = self.ranks[0]
        assert rank0.proc is not None, "stop() before spawn()"
        try:
            await asyncio.wait_for(asyncio.shield(rank0.proc.wait()), timeout_s)
        except asyncio.TimeoutError:
            log.warning(
                "model=%s group ignored SIGTERM for %.0fs: SIGKILL", self.model_id, timeout_s
            )
        else:  # rank 0 stopped its followers at the same step: they follow it out
            followers = [p.proc.wait() for p in self.ranks[1:] if p.proc is not None]
            if followers:
                await asyncio.wait(
                    [asyncio.ensure_future(w) for w in followers], timeout=FOLLOWER_GRACE_S
                )
        self.kill()
        return await rank0.proc.wait()

    def exit_summary(self) -> str:
        rank = self.failed_rank or 0
        summary = self.ranks[rank].exit_summary() if self.ranks else "it failed"
        return f"rank {rank}: {summary}" if rank else summary

    def describe_exit(self) -> str:
        rank = self.failed_rank or 0
        text = self.ranks[rank].describe_exit() if self.ranks else "never spawned"
        return f"rank {rank} of the worker group: {text}" if rank else text
