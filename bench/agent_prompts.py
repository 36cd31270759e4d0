"""What the agent workloads send, built without a server: a coding agent's tool list (OpenAI
and Anthropic shapes), the messages of an agent session sharing one long prefix, the
Claude-Code-shaped /v1/messages body, and the maths read off the answers (cache hit ratios).

Pure functions: tests/unit/test_bench_agents.py checks that sessions share exactly the prefix
and that two Claude Code sessions' bodies differ only in the billing line's suffix.
"""

from __future__ import annotations

from typing import Any

# What Claude Code puts first in its system prompt; the suffix (`cch=`) changes per session,
# so a prompt cache keyed on the exact text from the first token sees two sessions of the
# same project as different prompts.
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.abc; cc_entrypoint=sdk-cli; cch={};"
CLAUDE_MAX_TOKENS = 32000

# A coding agent's tools: name, description, and its parameters (name -> JSON type, help).
_TOOLS: tuple[tuple[str, str, dict[str, tuple[str, str]]], ...] = (
    ("Bash", "Run a shell command in the project", {"command": ("string", "the command"),
     "timeout": ("integer", "milliseconds"), "description": ("string", "what it does")}),
    ("Read", "Read a file", {"file_path": ("string", "absolute path"),
     "offset": ("integer", "first line"), "limit": ("integer", "how many lines")}),
    ("Write", "Write a file", {"file_path": ("string", "absolute path"),
     "content": ("string", "the whole file")}),
    ("Edit", "Replace a string in a file", {"file_path": ("string", "absolute path"),
     "old_string": ("string", "text to find"), "new_string": ("string", "replacement"),
     "replace_all": ("boolean", "every occurrence")}),
    ("MultiEdit", "Several edits to one file", {"file_path": ("string", "absolute path"),
     "edits": ("array", "old_string/new_string pairs")}),
    ("Glob", "Find files by pattern", {"pattern": ("string", "a glob"),
     "path": ("string", "where to look")}),
    ("Grep", "Search file contents", {"pattern": ("string", "a regex"),
     "path": ("string", "file or folder"), "glob": ("string", "file filter"),
     "output_mode": ("string", "content, files_with_matches or count")}),
    ("LS", "List a folder", {"path": ("string", "absolute path"),
     "ignore": ("array", "globs to leave out")}),
    ("Task", "Start a sub-agent on a task", {"description": ("string", "short title"),
     "prompt": ("string", "the task"), "subagent_type": ("string", "which agent")}),
    ("TodoWrite", "Update the task list", {"todos": ("array", "the items")}),
    ("WebFetch", "Fetch a URL and read it", {"url": ("string", "the address"),
     "prompt": ("string", "what to extract")}),
    ("WebSearch", "Search the web", {"query": ("string", "the query"),
     "allowed_domains": ("array", "only these")}),
    ("NotebookEdit", "Edit a notebook cell", {"notebook_path": ("string", "absolute path"),
     "cell_id": ("string", "which cell"), "new_source": ("string", "its source")}),
    ("BashOutput", "Read a background shell's output", {"bash_id": ("string", "the shell"),
     "filter": ("string", "a regex")}),
    ("KillShell", "Stop a background shell", {"shell_id": ("string", "the shell")}),
    ("ExitPlanMode", "Leave plan mode with a plan", {"plan": ("string", "the plan")}),
    ("SlashCommand", "Run a slash command", {"command": ("string", "the command")}),
    ("ListMcpResources", "List MCP resources", {"server": ("string", "the server")}),
    ("ReadMcpResource", "Read an MCP resource", {"server": ("string", "the server"),
     "uri": ("string", "the resource")}),
    ("AskUserQuestion", "Ask the user to choose", {"question": ("string", "the question"),
     "options": ("array", "the choices")}),
)  # fmt: skip


def _schema(params: dict[str, tuple[str, str]]) -> dict[str, Any]:
    props = {
        k: {
            "type": kind,
            "description": why,
            **({"items": {"type": "string"}} if kind == "array" else {}),
        }
        for k, (kind, why) in params.items()
    }
    first = next(iter(params))
    return {
        "type": "object",
        "properties": props,
        "required": [first],
        "additionalProperties": False,
    }


def anthropic_tools(n: int = len(_TOOLS)) -> list[dict[str, Any]]:
    """The first `n` tools as /v1/messages `tools` entries."""
    return [
        {"name": name, "description": why, "input_schema": _schema(p)}
        for name, why, p in _TOOLS[:n]
    ]


def openai_tools(n: int = len(_TOOLS)) -> list[dict[str, Any]]:
    """The same tools as /v1/chat/completions `tools` entries."""
    return [
        {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                          "parameters": t["input_schema"]}}
        for t in anthropic_tools(n)
    ]  # fmt: skip


def session_messages(system: str, users: list[str], replies: list[str]) -> list[dict[str, str]]:
    """An agent session's chat messages: the shared system prompt, then its own user turns
    with the replies between them (len(replies) is len(users) or one less)."""
    out = [{"role": "system", "content": system}]
    for i, user in enumerate(users):
        out.append({"role": "user", "content": user})
        if i < len(replies):
            out.append({"role": "assistant", "content": replies[i]})
    return out


def billing_line(suffix: str) -> str:
    """Claude Code's first system block, with this session's suffix."""
    return BILLING.format(suffix)


def claude_body(
    instructions: str,
    suffix: str,
    users: list[str],
    replies: list[str],
    model: str | None = None,
    tools: int = len(_TOOLS),
) -> dict[str, Any]:
    """A Claude-Code-shaped /v1/messages body: the billing line, then the long instructions
    (marked for caching, as Claude Code marks them), the tools, the turns so far."""
    messages: list[dict[str, Any]] = []
    for i, user in enumerate(users):
        messages.append({"role": "user", "content": [{"type": "text", "text": user}]})
        if i < len(replies):
            messages.append(
                {"role": "assistant", "content": [{"type": "text", "text": replies[i]}]}
            )
    body: dict[str, Any] = {
        "max_tokens": CLAUDE_MAX_TOKENS,
        "stream": True,
        "temperature": 0,
        "system": [
            {"type": "text", "text": billing_line(suffix)},
            {"type": "text", "text": instructions, "cache_control": {"type": "ephemeral"}},
        ],
        "tools": anthropic_tools(tools),
        "messages": messages,
    }
    return {**body, "model": model} if model else body


def claude_chat(instructions: str, suffix: str, users: list[str], replies: list[str]) -> list:
    """The same content as chat messages (for a server without /v1/messages): the system
    blocks joined by a blank line."""
    return session_messages(f"{billing_line(suffix)}\n\n{instructions}", users, replies)


def hit_ratio(cached: list[int | None], prompt: list[int | None]) -> float | None:
    """Prompt tokens served from the prefix cache over all prompt tokens (None: a server that
    did not say, or no prompt tokens)."""
    if not prompt or any(c is None for c in cached) or any(p is None for p in prompt):
        return None
    total = sum(p for p in prompt if p is not None)
    return sum(c for c in cached if c is not None) / total if total else None


def reused_fraction(cache_read: int | None, input_tokens: int | None) -> float | None:
    """Anthropic usage: cache reads over the whole prompt (its input_tokens leave them out)."""
    if cache_read is None or input_tokens is None or cache_read + input_tokens == 0:
        return None
    return cache_read / (cache_read + input_tokens)
