"""System text made the same across sessions before it is rendered: attribution lines leave.

Claude Code starts its system prompt with a block of its own,
`x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;`, whose last
three hex digits are a fingerprint of the session's first prompt. Left in, every new session's
prompt differs from the last one's at its ~20th token and the whole 12-40k-token prompt is
prefilled again. The line is for Anthropic's billing, not for a model: it leaves the system
text (`strip_attribution_lines`, on by default; docs/coding-agents.md) at the one place every
surface's messages pass on their way to the chat template (prompts.prepare_messages).
"""

from __future__ import annotations

import re
from typing import Any

ATTRIBUTION_PREFIX = "x-anthropic-billing-header:"
# The line's fields, each ` key=value;` (cc_version, cc_entrypoint, cch, cc_workload, ...).
_FIELDS = re.compile(re.escape(ATTRIBUTION_PREFIX) + r"(?: ?[\w.-]+=[^;\s]*;)+")
# What may follow them on the line and still be the line's own: spaces, and fields without
# their `;`, each after a space (so a line of `a=b=c=…` cannot be split up many ways).
_MORE_FIELDS = re.compile(r"(?:[ \t]+[\w.-]+=[^;\s]*;?)*[ \t]*\r?\n?")


def strip_attribution_lines(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation without attribution lines in its system messages (a `developer`
    message is a system one by now). A message left without text is left out, as if the
    client had not sent the block that held only the line; every other message is the same
    object as before."""
    out = []
    for msg in messages:
        content = msg.get("content")
        if msg.get("role") in ("system", "developer") and isinstance(content, str):
            text = strip_attribution(content)
            if text != content:
                if not text.strip():
                    continue
                msg = {**msg, "content": text}
        out.append(msg)
    return out


def strip_attribution(text: str) -> str:
    """`text` without its attribution lines; every other character stays as it was.

    A line that starts with the prefix goes with its line end. Where it stood as a paragraph
    of its own (a block joined to the next with a blank line, as the Anthropic surface joins
    system blocks), the blank lines after it go too; where it ends the text, so does the
    whitespace before it: the text reads as if the block had never been sent. Parts joined
    with no separator (OpenAI content parts) leave the next part's text on the line, right
    after the fields: then only the fields go.
    """
    if ATTRIBUTION_PREFIX not in text:
        return text
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    out: list[str] = []
    drop_blank = at_end = False
    for line in lines:
        if line.startswith(ATTRIBUTION_PREFIX):
            rest = _glued_text(line)
            if rest is None:
                drop_blank = not out or not out[-1].strip()  # it was a paragraph of its own
                at_end = True
                continue
            line = rest
        if drop_blank and not line.strip():
            continue
        drop_blank = False
        at_end = at_end and not line.strip()
        out.append(line)
    if at_end:  # nothing but whitespace after the last one: the text ends where it began
        while out and not out[-1].strip():
            out.pop()
        if out:
            out[-1] = re.sub(r"\r?\n\Z", "", out[-1])
    return "".join(out)


def _glued_text(line: str) -> str | None:
    """The text glued to an attribution line's fields (another part's), or None when the
    whole line is the attribution's."""
    fields = _FIELDS.match(line)
    if fields is None:
        return None
    rest = line[fields.end() :]
    if _MORE_FIELDS.fullmatch(rest):
        return None
    return rest.lstrip(" \t")
