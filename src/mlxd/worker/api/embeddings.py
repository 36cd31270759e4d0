"""POST /v1/embeddings on the worker's socket, and the guard that keeps each kind of model to
its own routes (a chat request to an embedding model is a 400, and the other way round).

The request is tokenized off the event loop, checked against its bounds before any forward,
planned into forwards (embed/plan.py) and run one forward per engine job, so chat rows sharing
the engine wait at most one forward at a time.
"""

from __future__ import annotations

import asyncio

import numpy as np
from aiohttp import web

from mlxd.shared.adapters import ADAPTER_HEADER
from mlxd.shared.errors import BadRequest
from mlxd.shared.model_facts import kind_refusal
from mlxd.shared.routes import WORKER_CHAT_PATHS
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.shared.wire.embeddings import EmbeddingRequest, embedding_list_bytes
from mlxd.worker.chat.state import WorkerState
from mlxd.worker.embed.forward import EmbedRun, EmbedStep
from mlxd.worker.embed.plan import plan_forwards
from mlxd.worker.engine.loop import Engine
from mlxd.worker.model.load import LoadedModel

# Tokens one request may embed in all (OpenAI's own bound); each input is bounded by the
# model's context limit, and each forward by the engine's prefill chunk and batch.
MAX_REQUEST_TOKENS = 300_000
# LoRA adapters change generation only: an embedding is always the base model's.
NO_ADAPTERS = (
    "LoRA adapters apply to text generation; embeddings come from the base model: name "
    "'{model}' without an adapter"
)


@web.middleware
async def kind_guard(request: web.Request, handler):
    """A chat route on an embedding model's worker is a 400 naming the route to use."""
    state: WorkerState = request.app["state"]
    if request.path in WORKER_CHAT_PATHS and state.facts is not None:
        why = kind_refusal(state.facts, state.config.model_id, "chat")
        if why is not None:
            raise BadRequest(why, param="model", code="model_type_mismatch")
    return await handler(request)


def _tokenize(tokenizer, inputs: list[str | list[int]]) -> list[list[int]]:
    # Strings get the tokenizer's special tokens (Qwen3-Embedding's appends the end-of-text
    # token its last-token pooling reads); token ids are taken as they are.
    return [tokenizer.encode(x) if isinstance(x, str) else x for x in inputs]


def truncated(tokens: list[list[int]], m: LoadedModel, texts: list[bool]) -> list[list[int]]:
    """Inputs cut to the context limit. A text keeps its last token when it is a special one
    (the end marker a tokenizer appends for last-token pooling)."""
    n = m.context_limit
    special = set(getattr(m.tokenizer, "all_special_ids", None) or ())
    out = []
    for ids, text in zip(tokens, texts):
        if len(ids) > n:
            ids = ids[: n - 1] + ids[-1:] if text and ids[-1] in special else ids[:n]
        out.append(ids)
    return out


def check_tokens(tokens: list[list[int]], m: LoadedModel) -> int:
    """The request's token count; a 400 for an input the model cannot embed."""
    vocab = m.vocab_size
    total = 0
    for i, ids in enumerate(tokens):
        if not ids:
            raise BadRequest(f"Invalid 'input': input {i} has no tokens", param="input")
        if len(ids) > m.context_limit:
            raise BadRequest(
                f"Input {i} has {len(ids)} tokens; this model's maximum context length is "
                f"{m.context_limit} tokens per input. Please shorten it",
                param="input",
                code="context_length_exceeded",
            )
        if min(ids) < 0 or max(ids) >= vocab:
            raise BadRequest(
                f"Invalid 'input': input {i} has a token id outside 0..{vocab - 1}", param="input"
            )
        total += len(ids)
    if total > MAX_REQUEST_TOKENS:
        raise BadRequest(
            f"The request has {total} tokens; at most {MAX_REQUEST_TOKENS} tokens can be "
            "embedded per request",
            param="input",
        )
    return total


def finish(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Truncate to `dimensions` (Matryoshka-style), then scale to unit length."""
    v = vector[:dimensions] if dimensions else vector
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


async def embed(engine: Engine, m: LoadedModel, tokens: list[list[int]], pooling) -> list:
    """Pooled vectors of `tokens`, one engine job per forward (cancelling stops between)."""
    run = EmbedRun(m.model, tokens, pooling)
    loop = asyncio.get_running_loop()
    plan = plan_forwards([len(t) for t in tokens], engine.plan.idle_chunk, engine.batch_size)
    for fwd in plan:
        step = EmbedStep(run, fwd, loop)
        engine.run_job(step)
        await step.done
    return run.vectors


async def embeddings(request: web.Request) -> web.Response:
    """POST /v1/embeddings (OpenAI's shape; docs/api.md)."""
    state: WorkerState = request.app["state"]
    m, engine = state.ready()
    facts = state.facts
    if facts is not None and (why := kind_refusal(facts, m.model_id, "embedding")):
        raise BadRequest(why, param="model", code="model_type_mismatch")
    if request.headers.get(ADAPTER_HEADER):
        raise BadRequest(NO_ADAPTERS.format(model=m.model_id), param="model")
    req = parse_model(EmbeddingRequest, load_json(await request.read()))
    width = (facts.hidden_size if facts else None) or int(m.config.get("hidden_size") or 0)
    if req.dimensions and width and req.dimensions > width:
        raise BadRequest(
            f"Invalid 'dimensions': this model's embeddings have {width} dimensions, "
            f"{req.dimensions} were asked for",
            param="dimensions",
        )
    inputs = req.inputs()
    tokens = await asyncio.to_thread(_tokenize, m.tokenizer, inputs)
    if req.truncate:
        tokens = truncated(tokens, m, [isinstance(x, str) for x in inputs])
    total = check_tokens(tokens, m)
    pooled = await embed(engine, m, tokens, facts.pooling if facts else "last")
    vectors = [finish(v, req.dimensions) for v in pooled]
    body = embedding_list_bytes(vectors, m.model_id, total, req.encoding_format)
    return web.Response(body=body, content_type="application/json")
