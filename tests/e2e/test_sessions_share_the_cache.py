"""A new Claude Code session reuses the last one's prompt from the cache (strip_attribution_lines).

Claude Code's first system block is `x-anthropic-billing-header: cc_version=<version>.<3 hex>;
cc_entrypoint=…;`, its suffix different from one session to the next. Two sessions' first
requests, through the official anthropic SDK and a real daemon, differ only there (and in
metadata.user_id's session id, as Claude Code's do): the daemon takes the line out and the
second request reads its whole prompt from the cache; with the setting off, the prompts part
at the suffix and the second reuses only the few tokens before it.
"""

from __future__ import annotations

import anthropic
import pytest

HEADER = "x-anthropic-billing-header: cc_version=2.1.332.{}; cc_entrypoint=sdk-cli;"
PROMPT = "\n\n".join(
    f"Rule {i}: before you edit file number {i}, read it whole and run its {i * 7} tests."
    for i in range(30)
)
USER = [{"role": "user", "content": "Which rule covers file 12?"}]


def _session(client: anthropic.Anthropic, suffix: str):
    """The first request of a session whose attribution line ends in `suffix`."""
    return client.messages.create(
        model="a",
        max_tokens=4,
        system=[
            {"type": "text", "text": HEADER.format(suffix)},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}},
        ],
        messages=USER,
        metadata={"user_id": f'{{"device_id":"d1","session_id":"session-{suffix}"}}'},
        extra_body={"temperature": 0},
    )


def _prompt_tokens(message) -> tuple[int, int]:
    """(the prompt's tokens, those read from the cache): Anthropic counts them apart."""
    u = message.usage
    cached = u.cache_read_input_tokens or 0
    return u.input_tokens + cached, cached


@pytest.mark.parametrize(
    "strip", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["default", "off"]
)
def test_the_second_session_reuses_the_first_ones_prompt(make_daemon, strip):
    env = {} if strip else {"MLXD_STRIP_ATTRIBUTION_LINES": "false"}
    d = make_daemon(env=env)
    client = anthropic.Anthropic(base_url=d.url, api_key="sk-test", max_retries=0, timeout=120)
    first = _session(client, "a1b")
    second = _session(client, "c2d")
    total, cached = _prompt_tokens(second)
    assert total > 1000 and _prompt_tokens(first)[1] < 0.1 * total  # a long prompt, cold
    if strip:
        assert cached >= 0.9 * total, (total, cached)
        assert second.content[0].text == first.content[0].text  # the same prompt, greedy
    else:
        assert cached < 0.1 * total, (total, cached)  # only the template's start, up to ".c2d"
    # count_tokens renders what a generation would: the line counts only when it is kept.
    counted = [
        client.messages.count_tokens(model="a", system=system, messages=USER).input_tokens
        for system in (f"{HEADER.format('a1b')}\n\n{PROMPT}", PROMPT)
    ]
    assert (counted[0] == counted[1]) is strip
