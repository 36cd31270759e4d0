"""Compile structured-output constraints in child processes, bounded in time, memory and number.

Each compile runs in its own child (worker/grammar/compile_child.py) under an address-space limit,
watched for resident memory and killed at its deadline or when every request waiting for it
has gone. At most `concurrency` children compile at once; a request that finds them all busy
waits up to `queue_timeout_s`, then gets a 503. Requests for the same constraint share one
compile, and results stay in a byte-capped LRU. Nothing here holds a lock across a compile.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import signal
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from mlxd.shared.byte_lru import ByteLRU
from mlxd.shared.errors import BadRequest, Unavailable
from mlxd.shared.sizes import format_size
from mlxd.worker.grammar.child_io import kill, read_answer, watch_memory
from mlxd.worker.grammar.compile_child import frame
from mlxd.worker.grammar.limits import GrammarLimits, GrammarTooLarge, check_spec

log = logging.getLogger("mlxd.worker.grammar")

_FAILURES_KEPT = 256  # constraints remembered as too complex, so retries cost nothing


class GrammarTooComplex(BadRequest):
    """Within the static bounds, but over the compile's time or memory limit: a 400, because
    the same constraint fails the same way on a retry (it is the request, not the server)."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message, param=param, code="grammar_too_complex")


class CompileFailed(Exception):
    """The constraint is not something the grammar engine can express (the caller degrades)."""


@dataclass(frozen=True)
class CompileSettings:
    """The compile bounds; each field is the worker setting `grammar_<name>`."""

    limits: GrammarLimits = field(default_factory=GrammarLimits)
    compile_timeout_s: float = 30.0
    compile_memory_bytes: int = 2 * 1024**3
    compile_concurrency: int = 2
    queue_timeout_s: float = 10.0
    cache_bytes: int = 256 * 1024**2


@dataclass
class _Flight:
    task: asyncio.Task
    waiters: int = 0


class GrammarCompiler:
    """One per model: `await compile(kind, value, param)` gives an outlines-core Index."""

    def __init__(self, vocabulary_blob: bytes, settings: CompileSettings):
        self.settings = settings
        self._vocab_blob = vocabulary_blob
        self._slots = asyncio.Semaphore(settings.compile_concurrency)
        self._flights: dict[bytes, _Flight] = {}
        self._failures: OrderedDict[bytes, str] = OrderedDict()
        self.cache = ByteLRU(settings.cache_bytes)
        self._spare: asyncio.subprocess.Process | None = None

    async def compile(self, kind: str, value: Any, param: str):
        """The Index for a constraint; GrammarTooLarge / GrammarTooComplex (400), Unavailable
        (503, every compile slot busy) or CompileFailed (not expressible)."""
        check_spec(kind, value, param, self.settings.limits)
        key = orjson.dumps([kind, value], option=orjson.OPT_SORT_KEYS)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        if key in self._failures:
            raise GrammarTooComplex(self._failures[key].replace("{param}", param), param)
        # One compile per constraint and field name (the name is in its error messages).
        fkey = key + b"\0" + param.encode()
        flight = self._flights.get(fkey)
        if flight is None:
            flight = _Flight(asyncio.create_task(self._compile(key, kind, value, param)))
            self._flights[fkey] = flight
            new = flight  # the callback forgets this flight, never a later one under fkey
            flight.task.add_done_callback(lambda _t: self._forget(fkey, new))
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()  # everyone left: the child is killed
                # A request for the same constraint arriving while it dies starts afresh
                # rather than joining a compile that can only end cancelled.
                self._forget(fkey, flight)

    def _forget(self, fkey: bytes, flight) -> None:
        if self._flights.get(fkey) is flight:
            del self._flights[fkey]

    async def _compile(self, key: bytes, kind: str, value: Any, param: str):
        s = self.settings
        try:
            await asyncio.wait_for(self._slots.acquire(), s.queue_timeout_s)
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            raise Unavailable(
                f"all {s.compile_concurrency} grammar compile slots of this model "
                f"stayed busy for "
                f"{s.queue_timeout_s:g} s; retry shortly "
                "(grammar_compile_concurrency)",
                code="grammar_busy",
            ) from None
        started = time.monotonic()
        try:
            header, blob = await self._run_child(kind, value, param)
        finally:
            self._slots.release()
        if not header.get("ok"):
            reason, message = header.get("reason"), header.get("message", "")
            if reason == "too_large":
                raise GrammarTooLarge(message, param)
            if reason in ("timeout", "memory"):
                self._remember_failure(key, message, param)
                raise GrammarTooComplex(message, param)
            raise CompileFailed(message)
        assert blob is not None  # an ok answer carries the index (child_io.read_answer)
        index = await asyncio.to_thread(pickle.loads, blob)
        kept = self.cache.put(key, index, len(blob))
        log.info(
            "grammar compiled: %s for %s in %.2fs, %s%s",
            kind,
            param,
            time.monotonic() - started,
            format_size(len(blob)),
            "" if kept else " (too large to cache)",
        )
        return index

    def _remember_failure(self, key: bytes, message: str, param: str) -> None:
        self._failures[key] = message.replace(f"'{param}'", "'{param}'")
        while len(self._failures) > _FAILURES_KEPT:
            self._failures.popitem(last=False)

    async def _run_child(self, kind: str, value: Any, param: str) -> tuple[dict, bytes | None]:
        s = self.settings
        proc = await self._take_child()
        self._refill_spare()
        job = orjson.dumps(
            {"kind": kind, "value": value, "param": param, "limits": s.limits.to_dict()}
        )
        answer = asyncio.create_task(read_answer(proc))
        watch = asyncio.create_task(watch_memory(proc, s.compile_memory_bytes))
        try:
            assert proc.stdin is not None  # spawned with stdin=PIPE
            proc.stdin.write(frame(job))
            await proc.stdin.drain()
            done, _ = await asyncio.wait(
                {answer, watch}, timeout=s.compile_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if answer in done and (got := answer.result()) is not None:
                return got
            if watch in done:
                return _memory_failure(param, s.compile_memory_bytes)
            if not done:
                return {
                    "ok": False,
                    "reason": "timeout",
                    "message": f"'{param}' did not compile within {s.compile_timeout_s:g} s "
                    "(grammar_compile_timeout_s); simplify the constraint",
                }, None
            return await self._died(proc, param)
        except (BrokenPipeError, ConnectionResetError):
            return await self._died(proc, param)
        finally:
            answer.cancel()
            watch.cancel()
            kill(proc)
            await proc.wait()

    async def _died(self, proc, param: str) -> tuple[dict, None]:
        code = await proc.wait()
        err = (await proc.stderr.read(4096)).decode(errors="replace").strip()[-500:]
        log.warning("grammar compile child for %s exited with %s: %s", param, code, err)
        # Under RLIMIT_AS an allocation fails: Rust aborts, Python dies in MemoryError.
        if code in (-signal.SIGABRT, -signal.SIGKILL, -signal.SIGSEGV) or "memory" in err:
            return _memory_failure(param, self.settings.compile_memory_bytes)
        if code == -getattr(signal, "SIGXCPU", 24):
            return {
                "ok": False,
                "reason": "timeout",
                "message": f"'{param}' ran out of compile time (grammar_compile_timeout_s)",
            }, None
        return {
            "ok": False,
            "reason": "crashed",
            "message": f"the grammar compiler stopped (exit {code})",
        }, None

    async def _take_child(self) -> asyncio.subprocess.Process:
        proc, self._spare = self._spare, None
        if proc is None or proc.returncode is not None:
            proc = await self._spawn()
        return proc

    def _refill_spare(self) -> None:
        # A child that has started and imported the grammar engine while no one waited for
        # it takes ~0.1 s off the next compile.
        async def refill():
            if self._spare is None:
                proc = await self._spawn()
                if self._spare is None:
                    self._spare = proc
                else:
                    kill(proc)
                    await proc.wait()

        task = asyncio.create_task(refill())
        task.add_done_callback(_log_failure)

    async def _spawn(self) -> asyncio.subprocess.Process:
        s = self.settings
        cpu_s = int(s.compile_timeout_s) + 5  # a backstop should the worker vanish mid-compile
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mlxd.worker.grammar.compile_child",
            str(s.compile_memory_bytes),
            str(cpu_s),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdin is not None  # spawned with stdin=PIPE
        proc.stdin.write(frame(self._vocab_blob))
        await proc.stdin.drain()
        return proc

    async def close(self) -> None:
        """Stop the spare child (children exit by themselves when the worker does)."""
        proc, self._spare = self._spare, None
        if proc is not None:
            kill(proc)
            await proc.wait()


def _memory_failure(param: str, limit_bytes: int) -> tuple[dict, None]:
    return {
        "ok": False,
        "reason": "memory",
        "message": f"'{param}' needs more than {format_size(limit_bytes)} to compile "
        "(grammar_compile_memory_bytes); simplify the constraint",
    }, None


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not start a spare grammar compile child: %s", task.exception())
