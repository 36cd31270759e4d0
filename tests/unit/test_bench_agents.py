"""The pure parts of the agent benchmarks (bench/agent_prompts.py, bench/agents.py): what the
sessions send and the maths read off the answers. No server, no MLX."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench/` sits beside `src/`, outside the installed package
    sys.path.insert(0, str(ROOT))

from bench.agent_prompts import (  # noqa: E402
    BILLING,
    anthropic_tools,
    billing_line,
    claude_body,
    claude_chat,
    hit_ratio,
    openai_tools,
    reused_fraction,
    session_messages,
)
from bench.agents import RunResult, add_run, level_figures  # noqa: E402
from bench.client import StreamResult  # noqa: E402
from bench.context import _percentile  # noqa: E402
from bench.report import summarize  # noqa: E402


def _res(ttft: float, prompt: int | None = 100, cached: int | None = 90) -> StreamResult:
    return StreamResult(ttft, ttft + 1.0, 64, prompt, "x", True, cached)


def test_percentile_interpolates_between_closest_ranks():
    assert _percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert _percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.95) == pytest.approx(4.8)
    assert _percentile([7.0], 0.95) == 7.0


def test_hit_ratio_sums_tokens_over_requests_not_ratios():
    assert hit_ratio([90, 0], [100, 900]) == pytest.approx(0.09)
    assert hit_ratio([None, 5], [10, 10]) is None  # a server that did not say
    assert hit_ratio([], []) is None
    assert hit_ratio([0], [0]) is None


def test_reused_fraction_counts_cache_reads_into_the_prompt():
    # Anthropic's input_tokens leave the cache reads out.
    assert reused_fraction(300, 100) == 0.75
    assert reused_fraction(None, 100) is None
    assert reused_fraction(0, 0) is None


def test_mlxd_over_mlx_lm_is_the_ratio_of_run_medians():
    figs = level_figures(4)
    for ttfts, name in (([0.1, 0.3, 0.2], "mlxd"), ([0.4, 0.4, 0.8], "mlx_lm")):
        for t in ttfts:
            add_run(figs, name, RunResult([[_res(t), _res(t / 2)]], [1.0], 1.0))
    row = summarize(figs["first50"])
    assert row["median"] == {"mlxd": 0.2, "mlx_lm": 0.4}
    assert row["ratio"] == pytest.approx(0.5)
    assert row["spread"] == pytest.approx(0.5)  # mlx_lm's (0.8 - 0.4) / 2 / 0.4
    assert summarize(figs["later50"])["median"]["mlxd"] == pytest.approx(0.1)
    assert summarize(figs["hit"])["median"]["mlxd"] == pytest.approx(90.0)


def test_one_run_takes_percentiles_over_its_sessions_and_walls():
    figs = level_figures(3)
    sessions = [[_res(0.1), _res(0.5)], [_res(0.2), _res(0.6)], [_res(0.3), _res(0.7)]]
    add_run(figs, "mlxd", RunResult(sessions, [2.0, 3.0, 5.0], 5.5))
    assert figs["first50"].samples["mlxd"] == [pytest.approx(0.2)]
    assert figs["later95"].samples["mlxd"] == [pytest.approx(0.69)]
    assert figs["sess50"].samples["mlxd"] == [3.0]
    assert figs["sessmax"].samples["mlxd"] == [5.0]
    assert figs["wall"].samples["mlxd"] == [5.5]


def test_a_server_without_cached_tokens_gets_no_hit_sample_and_a_note():
    figs = level_figures(1)
    add_run(figs, "mlx_lm", RunResult([[_res(0.1, cached=None)]], [1.0], 1.0))
    assert "mlx_lm" not in figs["hit"].samples
    assert "mlx_lm reports no cached tokens" in figs["hit"].note


def test_agent_sessions_share_exactly_the_system_prompt_and_tools():
    system = "shared prefix " * 50
    a = session_messages(system, ["task A", "more A"], ["reply A"])
    b = session_messages(system, ["task B"], [])
    assert a[0] == b[0] == {"role": "system", "content": system}
    assert a[1] != b[1]  # each session's own turns start right after the prefix
    assert [m["role"] for m in a] == ["system", "user", "assistant", "user"]
    # Every turn extends the session's previous prompt.
    assert session_messages(system, ["task A"], [])[:2] == a[:2]
    assert openai_tools(20) == openai_tools(20)


def test_tools_are_twenty_with_json_schemas_in_both_shapes():
    tools = anthropic_tools()
    assert len(tools) == 20 and len({t["name"] for t in tools}) == 20
    for t, o in zip(tools, openai_tools(), strict=True):
        assert t["input_schema"]["type"] == "object"
        assert set(t["input_schema"]["required"]) <= set(t["input_schema"]["properties"])
        assert o["function"]["parameters"] == t["input_schema"]
    assert len(anthropic_tools(3)) == 3


def test_claude_sessions_differ_only_in_the_billing_suffix():
    args = ("long instructions", ["fix the bug"], [])
    one, two = claude_body(args[0], "a1b2c", *args[1:]), claude_body(args[0], "f00d1", *args[1:])
    assert one["system"][0]["text"] == billing_line("a1b2c")
    assert one["system"][0]["text"].startswith("x-anthropic-billing-header: cc_version=2.1.332.abc")
    assert one["system"][0]["text"].endswith("cch=a1b2c;")
    two["system"][0]["text"] = one["system"][0]["text"]
    assert json.dumps(one) == json.dumps(two)
    assert one["max_tokens"] == 32000 and one["stream"] is True and len(one["tools"]) == 20
    assert one["system"][1]["cache_control"] == {"type": "ephemeral"}


def test_claude_turns_alternate_and_the_chat_form_joins_the_system_blocks():
    body = claude_body("rules", "s", ["one", "two"], ["reply"], model="bench-a")
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["model"] == "bench-a"
    chat = claude_chat("rules", "s", ["one"], [])
    assert chat[0]["content"] == BILLING.format("s") + "\n\nrules"
