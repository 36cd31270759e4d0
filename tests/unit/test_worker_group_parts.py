"""Worker groups without MLX: the settings, every rank's spec and environment (an NCCL rank's
GPU), the events rank 0 broadcasts, how the group's process ends (over fake ranks), and a
rank's entry point refusing a GPU it was not given (one real process, before MLX loads)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from group_specs import settings_with, spec_of

from mlxd.shared.config import ConfigError
from mlxd.shared.params import GenerationParams
from mlxd.shared.worker_spec import GroupSpec
from mlxd.supervisor.lifecycle.group import GroupProcess, rank_specs, spawn_worker
from mlxd.supervisor.lifecycle.process import WorkerProcess
from mlxd.worker.dist import env as group_env_module
from mlxd.worker.dist.env import group_env, write_hostfile
from mlxd.worker.group import wire
from mlxd.worker.group.channel import Channel, LinkClosed


def test_a_group_entry_becomes_rank_zeros_spec(tmp_path):
    spec = spec_of(tmp_path, '[models.g]\ngroup_size = 2\nbackend = "ring"\n[models.one]\n')
    assert spec.group == GroupSpec(size=2, rank=0, backend="ring")
    assert spec_of(tmp_path, "[models.one]\n", "one").group is None
    s = settings_with(tmp_path, '[models.g]\nhosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]\n')
    assert (s.for_model("g").ranks, s.for_model("g").local_ranks) == (3, 1)


@pytest.mark.parametrize(
    "toml",
    [
        '[models.g]\ngroup_size = 2\nhosts = ["10.0.0.1", "10.0.0.2"]\n',
        '[models.g]\ngroup_size = 2\nbackend = "gloo"\n',
        "[models.g]\ngroup_size = 0\n",
    ],
)
def test_group_settings_mistakes_are_config_errors(tmp_path, toml):
    with pytest.raises((ConfigError, ValueError)):
        settings_with(tmp_path, toml)


def test_local_ranks_get_one_hostfile_ports_and_the_budget_split(tmp_path):
    spec = spec_of(tmp_path, "[models.g]\ngroup_size = 3\n")
    specs = rank_specs(spec, ["127.0.0.1"] * 3)
    assert [s.group.rank for s in specs] == [0, 1, 2]
    assert len({s.group.peers for s in specs}) == 1
    assert len({s.group.link for s in specs}) == 1
    assert all(s.memory_limit_bytes == 8000 // 3 for s in specs)
    hostfile = write_hostfile(specs[2].group)
    hosts = json.loads(Path(hostfile).read_text())
    assert len(hosts) == 3 and all(len(h) == 1 for h in hosts)
    ports = [int(h[0].split(":")[1]) for h in hosts]
    assert len(set(ports + [int(specs[0].group.link.split(":")[1])])) == 4
    env = group_env(specs[2].group, hostfile)
    assert env == {"MLX_RANK": "2", "MLX_WORLD_SIZE": "3", "MLX_HOSTFILE": hostfile}
    Path(hostfile).unlink()


def test_nccl_ranks_meet_at_rank_zero(tmp_path):
    spec = spec_of(tmp_path, '[models.g]\nhosts = ["10.0.0.1", "10.0.0.2"]\nbackend = "nccl"\n')
    specs = rank_specs(spec, ["10.0.0.1", "10.0.0.2"])
    assert write_hostfile(specs[1].group) is None
    env = group_env(specs[1].group)
    assert (env["NCCL_HOST_IP"], env["MLX_RANK"], env["MLX_WORLD_SIZE"]) == ("10.0.0.1", "1", "2")
    # One rank per host: each on its host's first GPU.
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    # Remote ranks use their own host's memory: only rank 0's share is this host's.
    assert [s.memory_limit_bytes for s in specs] == [8000, None]


def test_local_nccl_ranks_each_get_a_gpu_and_its_whole_budget(tmp_path):
    spec = spec_of(tmp_path, '[models.g]\ngroup_size = 2\nbackend = "nccl"\n')
    specs = rank_specs(spec, ["127.0.0.1"] * 2)
    assert [s.group.device for s in specs] == [0, 1]
    # Each rank has a GPU of its own: the budget is not split as it is for ranks sharing one.
    assert [s.memory_limit_bytes for s in specs] == [8000, 8000]
    gpus = [group_env(s.group, None, {})["CUDA_VISIBLE_DEVICES"] for s in specs]
    assert gpus == ["0", "1"]
    # Given GPUs (a scheduler's CUDA_VISIBLE_DEVICES): the rank takes its entry of them.
    given = {"CUDA_VISIBLE_DEVICES": "2, 3"}
    assert group_env(specs[1].group, None, given)["CUDA_VISIBLE_DEVICES"] == "3"
    with pytest.raises(ValueError, match="one GPU per rank"):
        group_env(specs[1].group, None, {"CUDA_VISIBLE_DEVICES": "5"})
    with pytest.raises(ValueError, match="lists 0"):  # "" hides every GPU, as CUDA reads it
        group_env(specs[0].group, None, {"CUDA_VISIBLE_DEVICES": ""})
    # Ring ranks share the process's device: no GPU is chosen for them.
    ring = rank_specs(spec_of(tmp_path, "[models.g]\ngroup_size = 2\n"), ["127.0.0.1"] * 2)
    assert ring[1].group.device is None
    assert "CUDA_VISIBLE_DEVICES" not in group_env(ring[1].group, None, given)


def test_without_a_gpu_list_the_drivers_count_decides(tmp_path, monkeypatch):
    spec = spec_of(tmp_path, '[models.g]\ngroup_size = 2\nbackend = "nccl"\n')
    rank1 = rank_specs(spec, ["127.0.0.1"] * 2)[1].group
    monkeypatch.setattr(group_env_module, "host_gpu_count", lambda: 2)
    assert group_env(rank1, None, {})["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.setattr(group_env_module, "host_gpu_count", lambda: 1)
    with pytest.raises(ValueError, match="this host has 1"):
        group_env(rank1, None, {})
    monkeypatch.setattr(group_env_module, "host_gpu_count", lambda: None)  # no driver to ask
    assert group_env(rank1, None, {})["CUDA_VISIBLE_DEVICES"] == "1"


def test_spawner_picks_a_group_for_a_group_spec(tmp_path):
    group = spec_of(tmp_path, "[models.g]\ngroup_size = 2\n")
    single = spec_of(tmp_path, "[models.one]\n", "one")
    assert isinstance(spawn_worker("g", group.to_argv(), tmp_path / "g.log"), GroupProcess)
    proc = spawn_worker("one", single.to_argv(), tmp_path / "one.log")
    assert type(proc) is WorkerProcess


def test_events_round_trip():
    p = GenerationParams(
        max_tokens=9, temperature=0.5, seed=7, logit_bias={3: -1.5}, stop=("\n\n",), logprobs=True
    )
    events = [
        wire.RowEvent(wire.SUBMIT, 1, "req-1", (1, 2, 3), p, "ns", 2, "conversation-1"),
        wire.RowEvent(wire.SUBMIT, 2, "req-1", (4,), GenerationParams(), "ns", restore=(4,)),
        wire.RowEvent(wire.PERSIST),
        wire.RowEvent(wire.CANCEL, 1),
        wire.RowEvent(wire.FORGET, session="conversation-1"),
        wire.RowEvent(wire.CLOSE),
        wire.RowEvent(wire.STOP),
    ]
    assert wire.decode(wire.encode(events)) == events
    assert wire.encode([]) == b"" and wire.decode(b"") == []
    hello = wire.Hello(
        seed=2**62,
        idle_chunk=512,
        step_budget=256,
        min_chunk=64,
        kv_budget_bytes=None,
        cache_ram_bytes=1 << 30,
    )
    assert wire.decode_hello(wire.encode_hello(hello)) == hello


class FakeRank:
    """A rank process that exits when told (or when killed)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self.signals: list[int] = []
        self._exited = asyncio.Event()
        self.proc = self

    def exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.exit(-signal.SIGKILL)

    def terminate(self) -> None:
        self.signals.append(signal.SIGTERM)

    async def reap(self) -> int:
        await self._exited.wait()
        return self.returncode

    async def wait(self) -> int:
        return await self.reap()

    def exit_summary(self) -> str:
        return f"exit code {self.returncode}"

    def describe_exit(self) -> str:
        return self.exit_summary()


def fake_group(tmp_path, n: int = 2) -> tuple[GroupProcess, list[FakeRank]]:
    spec = spec_of(tmp_path, f"[models.g]\ngroup_size = {n}\n")
    g = GroupProcess("g", spec, tmp_path / "g.log")
    g.ranks = [FakeRank(100 + i) for i in range(n)]  # type: ignore[list-item]
    return g, g.ranks  # type: ignore[return-value]


def test_a_followers_exit_ends_the_whole_group(tmp_path):
    async def run():
        g, ranks = fake_group(tmp_path, 3)
        reaping = asyncio.create_task(g.reap())
        await asyncio.sleep(0)
        ranks[1].exit(-signal.SIGKILL)  # kill -9 of rank 1
        code = await asyncio.wait_for(reaping, 5)
        assert code == -signal.SIGKILL and g.returncode == code
        assert signal.SIGKILL in ranks[0].signals and signal.SIGKILL in ranks[2].signals
        assert g.failed_rank == 1 and g.exit_summary().startswith("rank 1:")
        assert g.pid == 100

    asyncio.run(run())


def test_a_follower_that_exits_cleanly_under_a_serving_group_is_a_crash(tmp_path):
    async def run():
        g, ranks = fake_group(tmp_path)
        reaping = asyncio.create_task(g.reap())
        await asyncio.sleep(0)
        ranks[1].exit(0)
        assert await asyncio.wait_for(reaping, 5) != 0

    asyncio.run(run())


def test_a_stop_is_rank_zeros_and_ends_clean(tmp_path):
    async def run():
        g, ranks = fake_group(tmp_path)
        reaping = asyncio.create_task(g.reap())
        g.terminate()
        assert ranks[0].signals == [signal.SIGTERM] and ranks[1].signals == []
        ranks[0].exit(0)
        await asyncio.sleep(0)
        ranks[1].exit(0)  # told to stop by rank 0, in the same step
        assert await asyncio.wait_for(reaping, 5) == 0
        assert g.failed_rank is None

    asyncio.run(run())


def test_a_stop_where_a_follower_leaves_first_is_still_clean(tmp_path):
    """A follower has less to tear down than rank 0 (which persists the prompt cache): its
    earlier exit must not get rank 0 killed mid-teardown."""

    async def run():
        g, ranks = fake_group(tmp_path)
        reaping = asyncio.create_task(g.reap())
        g.terminate()
        ranks[1].exit(0)
        await asyncio.sleep(0.05)
        assert signal.SIGKILL not in ranks[0].signals
        ranks[0].exit(0)
        assert await asyncio.wait_for(reaping, 5) == 0
        assert g.failed_rank is None

    asyncio.run(run())


class FakeGroup:
    def __init__(self, rank: int, size: int):
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def test_links_carry_frames_in_order_and_votes_to_every_rank():
    pairs = [socket.socketpair() for _ in range(2)]
    lead = Channel(FakeGroup(0, 3), [a for a, _ in pairs])
    followers = [Channel(FakeGroup(r + 1, 3), [b]) for r, (_, b) in enumerate(pairs)]
    with ThreadPoolExecutor(2) as pool:  # followers read while rank 0 writes (socket buffers)
        for frame in (b"first", b"", b"x" * 70_000):
            got = [pool.submit(f.exchange) for f in followers]
            assert lead.exchange(frame) == frame
            assert [g.result(5) for g in got] == [frame, frame]
        # One follower cannot use its shard: every rank hears "yes, someone cannot".
        votes = [pool.submit(f.any, r == 1) for r, f in enumerate(followers)]
        assert lead.any(False) is True
        assert [v.result(5) for v in votes] == [True, True]
    pairs[0][0].close()  # rank 0 is gone: its follower stops instead of waiting forever
    with pytest.raises(LinkClosed):
        followers[0].exchange()
    with pytest.raises(ValueError):
        Channel(FakeGroup(0, 3), [pairs[1][0]])  # rank 0 needs a link to every follower
