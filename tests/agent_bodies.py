"""Request bodies shaped like coding agents' real ones, shared by unit and integration tests.

They follow what the CLIs send by default: Claude Code (2.1.x) on /v1/messages with system
blocks carrying cache_control, thinking, metadata, context_management, a mid-conversation
system reminder and max_tokens 32000; Codex CLI on /v1/responses with instructions,
developer messages, reasoning items with encrypted content, a namespace group of MCP tools,
its freeform apply_patch, hosted tools, store false, stream true and a prompt_cache_key.
"""

from __future__ import annotations

REMINDER = "The user switched to plan mode: do not edit files."
# Claude Code's first system block, as 2.1.197 sent it (its suffix is a fingerprint of the
# session's first prompt: "Say hello." gave 1c0, "List the files." 8a5). Not in
# CLAUDE_CODE_BODY: the worker takes it out before rendering (worker/chat/canonical.py).
BILLING_HEADER = "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;"

CLAUDE_CODE_BODY = {
    "model": "smollm2-135m-instruct",
    "max_tokens": 32000,
    "stream": True,
    "system": [
        {
            "type": "text",
            "text": "You are Claude Code, Anthropic's official CLI for Claude.",
            "cache_control": {"type": "ephemeral"},
        },
        {
            "type": "text",
            "text": "You are an interactive CLI tool that helps users with "
            "software engineering tasks.",
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        },
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "<system-reminder>As you answer, use the context "
                    "below.</system-reminder>",
                },
                {
                    "type": "text",
                    "text": "list the files here",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        },
        {"role": "system", "content": REMINDER},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should run ls.", "signature": "sig"},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "Bash",
                    "input": {"command": "ls", "description": "List files"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "README.md\nsrc"}
            ],
        },
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Executes a bash command",
            "input_schema": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
        },
        {
            "name": "Read",
            "description": "Reads a file",
            "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
            "cache_control": {"type": "ephemeral"},
        },
    ],
    "metadata": {"user_id": "user_abc_account__session_1234"},
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "temperature": 1,
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
}

APPLY_PATCH_GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF'

CODEX_BODY = {
    "model": "smollm2-135m-instruct",
    "instructions": "You are Codex, a coding agent running in a terminal.",
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [
                {"type": "input_text", "text": "<permissions>workspace-write</permissions>"}
            ],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "fix the failing test"}],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Look at the tests."}],
            "content": None,
            "encrypted_content": "gAAAAB...",
        },
        {
            "type": "function_call",
            "name": "exec_command",
            "namespace": None,
            "arguments": '{"cmd":"pytest -x"}',
            "call_id": "call_1",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "1 failed"},
        {
            "type": "function_call",
            "name": "search",
            "namespace": "mcp__docs__",
            "arguments": '{"q":"fixtures"}',
            "call_id": "call_2",
        },
        {"type": "function_call_output", "call_id": "call_2", "output": "see conftest.py"},
        {
            "type": "custom_tool_call",
            "name": "apply_patch",
            "call_id": "call_3",
            "input": "*** Begin Patch\n*** End Patch\n",
        },
        {"type": "custom_tool_call_output", "call_id": "call_3", "output": "Done!"},
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Approval mode changed to never."}],
        },
    ],
    "tools": [
        {
            "type": "function",
            "name": "exec_command",
            "description": "Runs a command",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}},
                "required": ["cmd"],
            },
        },
        {
            "type": "namespace",
            "name": "mcp__docs__",
            "description": "Tools in the docs MCP",
            "tools": [
                {
                    "type": "function",
                    "name": "search",
                    "description": "Search the docs",
                    "strict": False,
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                }
            ],
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Use the `apply_patch` tool to edit files.",
            "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH_GRAMMAR},
        },
        {"type": "web_search", "external_web_access": False},
        {"type": "image_generation", "output_format": "png"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199c3f1-session",
    "text": {"verbosity": "medium"},
}
