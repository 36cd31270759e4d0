"""The real coding-agent CLIs against a daemon on the tiny model, on their default tools.

`claude -p` (Claude Code, Anthropic Messages) and `codex exec` (Codex CLI, Responses API) are
installed from npm at pinned versions (tests/agents.py) and pointed at the daemon with only
the settings docs/coding-agents.md gives users. Each runs once plain and once with a slow
prefill (the hidden debug_prefill_delay_s setting holds the first token back) longer than the
client's stream idle timeout: it only succeeds because the worker sends the events these
clients count as activity (sse.Heartbeat), not only SSE comments or `ping`s.

Claude Code will not take an idle timeout under 300 s (CLAUDE_STREAM_IDLE_TIMEOUT_MS only
raises it), so its slow run sleeps 310 s; Codex's is set to 8 s.

Run time: MLX on a CPU prefills the tiny model at only ~100-200 tokens/s, and the tiny
tokenizer makes Claude Code's default prompt (system prompt and tool definitions) 43k tokens,
Codex's 21k. Codex runs on its full defaults (about 3 minutes a run on a 2-core host); Claude
Code keeps its default system prompt but runs with `--tools ""` unless
MLXD_TEST_AGENTS_FULL=1 asks for its default tools too (20+ minutes a run on such a host).
So the four CLI runs go behind MLXD_TEST_AGENTS=1: `make test-agents`, which CI (.ci/run) runs
after `make test`; the SDK check at the end always runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from agents import AgentsUnavailable, install_agents

# The agents' prompts are 5-20k tokens of English, many more with the tiny tokenizer.
CONTEXT = 65536
CONFIG = f"context_limit = {CONTEXT}\nstream_heartbeat_s = 5\n"
CLAUDE_IDLE_S = 300  # Claude Code's floor for CLAUDE_STREAM_IDLE_TIMEOUT_MS
CODEX_IDLE_MS = 8000  # above the worker's 5 s keep-alive tick (chat_run.KEEPALIVE_S)
PROMPT = "Say hello."
REPLY = "Hello from mlxd"


@pytest.fixture(scope="module")
def agents() -> dict[str, Path]:
    if os.environ.get("MLXD_TEST_AGENTS") != "1":
        # 20-30 minutes of CPU prefill on a 2-core host: `make test` stays fast, and CI runs
        # these right after it (`make test-agents`, from .ci/run).
        pytest.skip("the real agent CLIs run under `make test-agents` (MLXD_TEST_AGENTS=1)")
    try:
        return install_agents()
    except AgentsUnavailable as exc:
        pytest.skip(f"coding-agent CLIs not installed from npm: {exc}")


@pytest.fixture(scope="module")
def long_model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model made fit for an agent: room for its prompt, and replies that end.

    RoPE has no hard position limit, so the context is raised in the copy's config. Random
    weights almost never sample <|im_end|>, and an agent treats a reply cut at max_tokens as
    an error: in this copy every token holding sentence-ending punctuation also ends the turn,
    and decoding is greedy (generation_config), so replies are short and reproducible.
    """
    dest = tmp_path_factory.mktemp("tiny-agent") / "m"
    shutil.copytree(tiny_model_dir, dest)
    vocab = json.loads((dest / "tokenizer.json").read_text())["model"]["vocab"]
    stops = sorted(i for t, i in vocab.items() if any(c in t for c in ".!?"))
    edits = {
        "config.json": {"max_position_embeddings": CONTEXT},
        "tokenizer_config.json": {"model_max_length": CONTEXT},
        "generation_config.json": {"temperature": 0.0},
    }
    for name, changes in edits.items():
        cfg = json.loads((dest / name).read_text())
        cfg.update(changes)
        if name in ("config.json", "generation_config.json"):
            eos = cfg["eos_token_id"]
            cfg["eos_token_id"] = [*(eos if isinstance(eos, list) else [eos]), *stops]
        (dest / name).write_text(json.dumps(cfg))
    return dest


def _daemon(make_daemon, long_model, delay_s: float = 0.0):
    env = {"MLXD_DEBUG_PREFILL_DELAY_S": str(delay_s)} if delay_s else {}
    return make_daemon(models={"a": long_model}, config=CONFIG, env=env)


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout_s: float):
    # A clean environment: no proxy, key or config of the host leaks into the agent.
    base = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
    return subprocess.run(
        cmd,
        env={**base, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def run_claude(agents, url: str, *, timeout_s: float = 1400.0):
    home = Path(tempfile.mkdtemp(prefix="mlxd-claude-"))
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-mlxd-test",
        "ANTHROPIC_MODEL": "a",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "a",  # background calls stay on the daemon
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "32",  # random weights: a short reply is as good
        # Claude Code samples at temperature 1: a forced reply (mlxd's guided_regex) ends.
        "CLAUDE_CODE_EXTRA_BODY": json.dumps({"guided_regex": REPLY}),
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(CLAUDE_IDLE_S * 1000),
        "CLAUDE_CODE_MAX_RETRIES": "0",  # an idle abort fails the run instead of retrying
    }
    cmd = [str(agents["claude"]), "-p", PROMPT, "--model", "a"]
    if os.environ.get("MLXD_TEST_AGENTS_FULL") != "1":
        cmd += ["--tools", ""]  # see the module docstring: the tool list is 40k tokens here
    try:
        return _run(cmd, env, home, timeout_s)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run_codex(agents, url: str, *, timeout_s: float = 800.0):
    home = Path(tempfile.mkdtemp(prefix="mlxd-codex-"))
    (home / "config.toml").write_text(
        'model = "a"\nmodel_provider = "mlxd"\n\n[model_providers.mlxd]\nname = "mlxd"\n'
        f'base_url = "{url}/v1"\nwire_api = "responses"\n'
    )
    env = {"HOME": str(home), "CODEX_HOME": str(home)}
    overrides = [
        f"model_providers.mlxd.stream_idle_timeout_ms={CODEX_IDLE_MS}",
        "model_providers.mlxd.stream_max_retries=0",
        "model_providers.mlxd.request_max_retries=0",
    ]
    cmd = [str(agents["codex"]), "exec", "--skip-git-repo-check"]
    for o in overrides:
        cmd += ["-c", o]
    try:
        return _run([*cmd, PROMPT], env, home, timeout_s)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _explain(done, daemon) -> str:
    workers = "".join(
        p.read_text(errors="replace")[-3000:] for p in sorted((daemon.home / "logs").glob("*.log"))
    )
    return (
        f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n"
        f"{done.stderr[-3000:]}\ndaemon:\n{daemon.logs()[-3000:]}\nlogs:\n{workers}"
    )


@pytest.mark.timeout(1500)
def test_claude_code_gets_a_reply(agents, make_daemon, long_model):
    d = _daemon(make_daemon, long_model)
    done = run_claude(agents, d.url)
    assert done.returncode == 0 and REPLY in done.stdout, _explain(done, d)


@pytest.mark.timeout(900)
def test_codex_gets_a_reply(agents, make_daemon, long_model):
    d = _daemon(make_daemon, long_model)
    done = run_codex(agents, d.url)
    assert done.returncode == 0 and done.stdout.strip(), _explain(done, d)


@pytest.mark.timeout(900)
def test_codex_survives_a_prefill_longer_than_its_idle_timeout(agents, make_daemon, long_model):
    d = _daemon(make_daemon, long_model, delay_s=3 * CODEX_IDLE_MS / 1000)
    done = run_codex(agents, d.url)
    assert done.returncode == 0 and done.stdout.strip(), _explain(done, d)


@pytest.mark.timeout(1800)
def test_claude_code_survives_a_prefill_longer_than_its_idle_timeout(
    agents, make_daemon, long_model
):
    d = _daemon(make_daemon, long_model, delay_s=CLAUDE_IDLE_S + 10)
    done = run_claude(agents, d.url, timeout_s=1700)
    assert done.returncode == 0 and REPLY in done.stdout, _explain(done, d)


# -- the heartbeats through the official SDKs' stream accumulators (no CLI needed) ------------


@pytest.mark.slow
def test_sdk_streams_are_unchanged_by_heartbeats(make_daemon):
    """A slow first token brings heartbeats; the SDKs still build the same final message."""
    import anthropic

    d = make_daemon(config="stream_heartbeat_s = 1\n", env={"MLXD_DEBUG_PREFILL_DELAY_S": "6"})
    greedy = {"temperature": 0}
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    client = anthropic.Anthropic(base_url=d.url, api_key="sk-test", max_retries=0, timeout=60)
    with client.messages.stream(
        model="a", max_tokens=8, messages=msgs, extra_body=greedy
    ) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    # message_start, ping, then a heartbeat message_delta before any content
    assert kinds[:2] == ["message_start", "message_delta"], kinds
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 5
    assert final.content[0].type == "text" and final.content[0].text
    plain = client.messages.create(model="a", max_tokens=8, messages=msgs, extra_body=greedy)
    assert final.content[0].text == plain.content[0].text

    oai = d.openai()
    with oai.responses.stream(
        model="a", input="Weather in Paris?", max_output_tokens=8, temperature=0
    ) as stream:
        events = list(stream)
    kinds = [ev.type for ev in events]
    assert kinds.count("response.in_progress") >= 2, kinds  # the first, then heartbeats
    assert kinds.index("response.in_progress", 2) < kinds.index("response.output_item.added")
    last = events[-1].response  # max_output_tokens reached: response.incomplete
    assert kinds[-1] == "response.incomplete" and last.usage.output_tokens == 8
    deltas = "".join(ev.delta for ev in events if ev.type == "response.output_text.delta")
    assert last.output_text == deltas == final.content[0].text  # same greedy text as above


@pytest.mark.slow
def test_responses_heartbeats_are_small_and_the_sdk_still_builds_the_whole_response(make_daemon):
    """Codex sends ~18 KB of tools and instructions: each heartbeat used to repeat them."""
    d = make_daemon(config="stream_heartbeat_s = 1\n", env={"MLXD_DEBUG_PREFILL_DELAY_S": "6"})
    instructions = "You are a coding agent. " * 80  # Codex's are ~19 KB: too long here
    tools = [
        {"type": "function", "name": f"tool_{i}", "description": "d" * 200, "parameters": {}}
        for i in range(4)
    ]
    body = {"model": "a", "input": "Hi", "max_output_tokens": 4, "instructions": instructions}
    with d.http.stream("POST", "/v1/responses", json={**body, "tools": tools, "stream": True}) as r:
        raw = b"".join(r.iter_bytes())
    events = raw.split(b"\n\n")
    beats = [e for e in events if e.startswith(b"event: response.in_progress")][1:]
    assert beats, raw[:500]  # the first in_progress opens the stream; the rest are heartbeats
    assert len(events[0]) > 2800  # response.created echoes instructions and tools
    assert all(len(b) < 1024 for b in beats), [len(b) for b in beats]
    assert instructions.encode() not in b"".join(beats)

    with d.openai().responses.stream(**body, tools=tools) as stream:
        events = list(stream)
    kinds = [ev.type for ev in events]
    assert kinds.count("response.in_progress") >= 2, kinds
    final = events[-1].response
    assert final.instructions == instructions and len(final.tools) == len(tools)
    assert final.usage.output_tokens == 4 and final.output_text
