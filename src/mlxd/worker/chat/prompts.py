"""Turn wire requests into prompt token ids and fully resolved generation parameters."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from mlxd.shared.chat_job import (
    DEVELOPER_MARK,
    ChatJob,
    fold_system_messages,
    late_system_indexes,
)
from mlxd.shared.errors import BadRequest
from mlxd.shared.params import MAX_SEED, MIN_SEED, GenerationParams
from mlxd.shared.sampling import resolve, sampling_of
from mlxd.worker.chat.canonical import strip_attribution_lines
from mlxd.worker.chat.tool_prompt import WARNING as TOOLS_AS_TEXT
from mlxd.worker.chat.tool_prompt import template_renders_tools, with_tools_as_text
from mlxd.worker.model.load import LoadedModel

log = logging.getLogger("mlxd.worker.chat.prompts")


@dataclass
class ChatPrompt:
    """A rendered conversation: token ids, the text, and whether it ends inside reasoning."""

    ids: list[int]
    text: str
    kwargs: dict[str, Any]  # what the template was given (tools, enable_thinking, ...)
    in_reasoning: bool
    warning: str | None = None  # a `Warning` value: the tools were rendered as text


def chat_prompt(
    m: LoadedModel,
    messages: list[dict],
    tools: list[dict] | None = None,
    template_kwargs: dict | None = None,
    enable_thinking: bool | None = None,
    param: str = "messages",
) -> ChatPrompt:
    """Render the conversation through the model's chat template (`param`: the request
    field that holds it, for a 400).

    `enable_thinking` is the worker's default; the request's chat_template_kwargs win, and
    when both are silent the template decides. A template without a tool format gets the
    tools, earlier calls and their results as text instead (tool_prompt.py).
    """
    kwargs = dict(template_kwargs or {})
    if enable_thinking is not None:
        kwargs.setdefault("enable_thinking", enable_thinking)
    warning = None
    if tools and template_renders_tools(m.tokenizer, m.model_id):
        kwargs["tools"] = tools
    elif tools:
        messages, warning = with_tools_as_text(messages, tools), TOOLS_AS_TEXT
    try:
        text = m.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **kwargs
        )
    except Exception as exc:  # jinja raises for conversations the template rejects
        raise BadRequest(f"The chat template rejected the {param}: {exc}", param=param) from None
    check_prompt_bytes(m, text, param)
    ids = m.tokenizer.encode(text, add_special_tokens=False)
    return ChatPrompt(ids, text, kwargs, _ends_in_reasoning(m.tokenizer, text), warning)


def prepare_messages(
    m: LoadedModel, messages: list[dict], strip_attribution: bool = True
) -> list[dict]:
    """The conversation as this model's template gets it: a `developer` message keeps its
    role where the template knows it, else it is a system message; a conversation without a
    system or developer message starts with the model's default `system`, if it has one.

    Every surface's messages pass here before they are rendered: with `strip_attribution`
    (the `strip_attribution_lines` setting), per-session attribution lines leave the system
    text first (canonical.py), so a system message that held only that counts as absent."""
    if strip_attribution:
        messages = strip_attribution_lines(messages)
    native = "developer" in str(getattr(m.tokenizer, "chat_template", None) or "")
    out = []
    for msg in messages:
        if msg.get("role") == "developer" or DEVELOPER_MARK in msg:
            msg = {k: v for k, v in msg.items() if k != DEVELOPER_MARK}
            msg["role"] = "developer" if native else "system"
        out.append(msg)
    if m.defaults.system and not any(msg.get("role") in ("system", "developer") for msg in out):
        out.insert(0, {"role": "system", "content": m.defaults.system})
    return out


def _ends_in_reasoning(tokenizer, text: str) -> bool:
    """Templates such as DeepSeek-R1's open a think block in the generation prompt."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    return text.rfind(tokenizer.think_start) > text.rfind(tokenizer.think_end)


def completion_prompt(m: LoadedModel, prompt: str | list[int]) -> list[int]:
    """Tokenize a completions prompt (text, or token ids as given)."""
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("Invalid 'prompt': must not be empty", param="prompt")
        check_prompt_bytes(m, prompt, "prompt")
        return m.tokenizer.encode(prompt)
    vocab = m.vocab_size
    if any(not isinstance(t, int) or t < 0 or t >= vocab for t in prompt):
        raise BadRequest(f"Invalid 'prompt': token ids must be in [0, {vocab})", param="prompt")
    return list(prompt)


def check_prompt_bytes(m: LoadedModel, text: str, param: str) -> None:
    """Refuse, before tokenizing it, text too long to fit the context whatever its tokens.

    No token stands for more than `m.max_token_bytes` bytes of text, so text of B bytes is at
    least ceil(B / max_token_bytes) tokens: refusing when that alone reaches the context limit
    never refuses a prompt that would fit, and spares the seconds a 20 MB prompt takes to
    tokenize. (Only a tokenizer whose normalizer drops or merges characters, such as one that
    collapses runs of spaces, could need fewer tokens; such a prompt is mostly padding.)
    """
    bound = m.context_limit * m.max_token_bytes
    if len(text) * 4 <= bound:  # UTF-8 uses at most 4 bytes a character: no need to count
        return
    n_bytes = len(text.encode("utf-8", "surrogatepass"))
    at_least = -(-n_bytes // m.max_token_bytes)
    if at_least >= m.context_limit:
        raise BadRequest(
            f"The prompt is at least {at_least} tokens ({n_bytes} bytes); this model's "
            f"context limit is {m.context_limit} tokens",
            param=param,
            code="context_length_exceeded",
        )


def check_params(m: LoadedModel, p: GenerationParams) -> None:
    """What the model's sampler would fail on, as a 400 naming the field.

    The wire models bound what they can without the model; this repeats the seed bound for
    any caller that builds GenerationParams itself, and adds the vocabulary bounds.
    """
    vocab = m.vocab_size
    # top_k: None or -1 mean the model's default, 0 turns top-k off (see resolve_params);
    # mlx-lm's top-k filter accepts 0 < k < vocabulary and fails the whole batch otherwise.
    if p.top_k is not None and not -1 <= p.top_k < vocab:
        raise BadRequest(
            f"Invalid 'top_k': must be below this model's vocabulary size "
            f"({vocab}); 0 turns top-k sampling off",
            param="top_k",
        )
    if p.seed is not None and not MIN_SEED <= p.seed <= MAX_SEED:
        raise BadRequest(
            f"Invalid 'seed': must be an integer from {MIN_SEED} to {MAX_SEED}", param="seed"
        )
    if any(not 0 <= t < vocab for t in p.logit_bias):
        raise BadRequest(
            f"Invalid 'logit_bias': token ids must be below {vocab}", param="logit_bias"
        )
    if any(not math.isfinite(v) for v in p.logit_bias.values()):
        raise BadRequest("Invalid 'logit_bias': values must be finite numbers", param="logit_bias")
    if not 0 <= p.top_logprobs <= vocab:
        raise BadRequest(f"Invalid 'top_logprobs': must be at most {vocab}", param="top_logprobs")


def prompt_field(surface: str, raw: bool = False) -> str:
    """The request field that holds the prompt, for a 400 about it."""
    return "prompt" if raw else "input" if surface == "responses" else "messages"


def fit_max_tokens(
    context_limit: int,
    prompt_len: int,
    requested: int | None,
    surface: str = "openai",
    raw: bool = False,
) -> int:
    """How many tokens a request may generate: THE one rule, for every surface.

    The output gets the room the prompt leaves in the context: a larger max_tokens (Claude
    Code always asks for 32000) is clamped to it, as local servers do, and the row then
    ends as any row that reaches its max_tokens does (`finish_reason: "length"`,
    `stop_reason: "max_tokens"`, Responses `incomplete` / `max_output_tokens`). Only a
    prompt that fills the context by itself, with no room for one token, is refused; on
    the Anthropic surface in Anthropic's wording, which Claude Code parses to retry.

    Memory admission (a later issue) owns this rule and will extend it here (KV bytes for
    the rows in flight); callers should keep going through this one function.
    """
    room = context_limit - prompt_len
    if room <= 0:
        if surface == "anthropic":
            raise BadRequest(
                f"input length and `max_tokens` exceed context limit: {prompt_len} + "
                f"{requested or 1} > {context_limit}, decrease input length or `max_tokens` "
                "and try again",
                param="messages",
                code="context_length_exceeded",
            )
        raise BadRequest(
            f"The prompt is {prompt_len} tokens; this model's context limit is "
            f"{context_limit} tokens",
            param=prompt_field(surface, raw),
            code="context_length_exceeded",
        )
    if requested is None:
        return room
    if requested > room:
        log.debug(
            "max_tokens %d clamped to the %d tokens the prompt (%d) leaves in the context (%d)",
            requested,
            room,
            prompt_len,
            context_limit,
        )
    return min(requested, room)


def resolve_params(
    m: LoadedModel,
    p: GenerationParams,
    prompt_len: int,
    surface: str = "openai",
    raw: bool = False,
) -> GenerationParams:
    """Check `p` against the model, fill defaults from it and fit max_tokens into the context
    (`fit_max_tokens`).

    Every surface (chat, completions, messages, responses) passes through here.
    """
    check_params(m, p)
    limit = m.context_limit
    if p.context_window is not None and p.context_window < limit:
        limit = p.context_window
        if prompt_len >= limit:  # Ollama would cut the prompt's start; a 400 says why instead
            raise BadRequest(
                f"The prompt is {prompt_len} tokens, more than the request's context window "
                f"(num_ctx {limit}) leaves room for",
                param="options.num_ctx",
                code="context_length_exceeded",
            )
    d = m.defaults
    requested = d.max_tokens if p.max_tokens is None else p.max_tokens
    max_tokens = fit_max_tokens(limit, prompt_len, requested, surface, raw)
    # Any: keyword arguments by name into GenerationParams' sampling fields
    sampling: dict[str, Any] = resolve(sampling_of(p), d.sampling)
    if (p.top_k is None or p.top_k < 0) and not 0 <= sampling["top_k"] < m.vocab_size:
        sampling["top_k"] = 0  # a default outside the vocabulary would fail every unset request
    return replace(p, max_tokens=max_tokens, max_tokens_open=requested is None, **sampling)


def render_job(m, job: ChatJob, enable_thinking: bool | None) -> ChatPrompt:
    """Render `job` through the chat template, keeping every system message's text.

    A system message after the first turn (Claude Code's mid-conversation reminders, a
    Responses `developer` item) stays in place where the template renders it there; where
    the template refuses it, or renders the conversation without its text, it is folded
    into a user turn as a delimited note (`fold_system_messages`).
    """
    late = late_system_indexes(job.messages)
    param = prompt_field(job.surface)
    if late:
        try:
            prompt = chat_prompt(
                m, job.messages, job.rendered_tools, job.template_kwargs, enable_thinking, param
            )
        except BadRequest:
            prompt = None
        if prompt is not None and all(
            str(job.messages[i].get("content") or "").strip() in prompt.text for i in late
        ):
            return prompt
        log.debug(
            "folding %d later system message(s) into user turns: the template %s",
            len(late),
            "refused them" if prompt is None else "left their text out",
        )
        job.messages = fold_system_messages(job.messages)
    return chat_prompt(
        m, job.messages, job.rendered_tools, job.template_kwargs, enable_thinking, param
    )
