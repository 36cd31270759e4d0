"""Turn wire requests into prompt token ids and fully resolved generation parameters."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mlxd.shared.errors import BadRequest
from mlxd.shared.params import GenerationParams
from mlxd.shared.wire_openai import CompletionRequest

from .loaded import LoadedModel


@dataclass
class ChatPrompt:
    """A rendered conversation: token ids, the text, and whether it ends inside reasoning."""

    ids: list[int]
    text: str
    kwargs: dict[str, Any]  # what the template was given (tools, enable_thinking, ...)
    in_reasoning: bool


def chat_prompt(m: LoadedModel, messages: list[dict], tools: list[dict] | None = None,
                template_kwargs: dict | None = None,
                enable_thinking: bool | None = None) -> ChatPrompt:
    """Render the conversation through the model's chat template.

    `enable_thinking` is the worker's default; the request's chat_template_kwargs win, and
    when both are silent the template decides.
    """
    kwargs = dict(template_kwargs or {})
    if enable_thinking is not None:
        kwargs.setdefault("enable_thinking", enable_thinking)
    if tools:
        kwargs["tools"] = tools
    try:
        text = m.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **kwargs
        )
    except Exception as exc:  # jinja raises for conversations the template rejects
        raise BadRequest(f"The chat template rejected the messages: {exc}", param="messages") from None
    ids = m.tokenizer.encode(text, add_special_tokens=False)
    return ChatPrompt(ids, text, kwargs, _ends_in_reasoning(m.tokenizer, text))


def _ends_in_reasoning(tokenizer, text: str) -> bool:
    """Templates such as DeepSeek-R1's open a think block in the generation prompt."""
    if not getattr(tokenizer, "has_thinking", False):
        return False
    return text.rfind(tokenizer.think_start) > text.rfind(tokenizer.think_end)


def completion_prompt(m: LoadedModel, req: CompletionRequest) -> list[int]:
    """Tokenize a completions prompt (text, or token ids as given)."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("Invalid 'prompt': must not be empty", param="prompt")
        return m.tokenizer.encode(prompt)
    vocab = m.vocab_size
    if any(not isinstance(t, int) or t < 0 or t >= vocab for t in prompt):
        raise BadRequest(f"Invalid 'prompt': token ids must be in [0, {vocab})", param="prompt")
    return list(prompt)


def resolve_params(m: LoadedModel, p: GenerationParams, prompt_len: int) -> GenerationParams:
    """Fill defaults from the model and fit max_tokens into the context limit."""
    room = m.context_limit - prompt_len
    if room <= 0:
        raise BadRequest(
            f"The prompt is {prompt_len} tokens; this model's context limit is "
            f"{m.context_limit} tokens",
            param="messages",
            code="context_length_exceeded",
        )
    if p.max_tokens is not None and p.max_tokens > room:
        raise BadRequest(
            f"max_tokens ({p.max_tokens}) plus the prompt ({prompt_len} tokens) exceeds the "
            f"context limit of {m.context_limit} tokens",
            param="max_tokens",
            code="context_length_exceeded",
        )
    vocab = m.vocab_size
    if any(t >= vocab for t in p.logit_bias):
        raise BadRequest(f"Invalid 'logit_bias': token ids must be below {vocab}",
                         param="logit_bias")
    d = m.defaults
    return replace(
        p,
        max_tokens=p.max_tokens or room,
        temperature=d.temperature if p.temperature is None else p.temperature,
        top_p=d.top_p if p.top_p is None else p.top_p,
        top_k=d.top_k if p.top_k is None or p.top_k < 0 else p.top_k,
        min_p=d.min_p if p.min_p is None else p.min_p,
    )
