"""Turn wire requests into prompt token ids and fully resolved generation parameters."""

from __future__ import annotations

from dataclasses import replace

from mlxd.shared.errors import BadRequest
from mlxd.shared.params import GenerationParams
from mlxd.shared.wire_openai import ChatCompletionRequest, CompletionRequest

from .loaded import LoadedModel


def chat_prompt(m: LoadedModel, req: ChatCompletionRequest) -> list[int]:
    """Render the conversation through the model's chat template."""
    kwargs = dict(req.chat_template_kwargs or {})
    if req.tools:
        kwargs["tools"] = req.tools
    try:
        text = m.tokenizer.apply_chat_template(
            req.template_messages(), add_generation_prompt=True, tokenize=False, **kwargs
        )
    except Exception as exc:  # jinja raises for conversations the template rejects
        raise BadRequest(f"The chat template rejected the messages: {exc}", param="messages") from None
    return m.tokenizer.encode(text, add_special_tokens=False)


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
