"""POST /v1/chat/completions and /v1/completions on the worker's socket."""

from __future__ import annotations

import time
import uuid

import orjson
from aiohttp import web

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.errors import Unavailable
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.shared.wire.openai import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    CompletionRequest,
    ResponseMessage,
    Usage,
)
from mlxd.shared.wire.tools import custom_input
from mlxd.worker.api import sse
from mlxd.worker.api.generation import Generation
from mlxd.worker.cache.keys import make_cache_key, session_of
from mlxd.worker.chat.prompts import completion_prompt, resolve_params
from mlxd.worker.chat.run import KEEPALIVE_S, ChatRun, Delta, Keepalive, RowProgress, ToolCalls
from mlxd.worker.chat.tool_calls import ToolCall
from mlxd.worker.engine.logprobs import chat_logprobs, completion_logprobs
from mlxd.worker.grammar.processor import row_processors, warning_header
from mlxd.worker.state import WorkerState


def _json(body, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(body.model_dump()), content_type="application/json", headers=headers
    )


def _usage(gen: Generation, completion: int) -> Usage:
    return Usage.of(gen.prompt_tokens, completion, cached=gen.cached_tokens)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state: WorkerState = request.app["state"]
    state.ready()
    req = parse_model(ChatCompletionRequest, load_json(await request.read()))
    job = req.to_chat_job()
    job.session = session_of(request, req)
    rid = "chatcmpl-" + uuid.uuid4().hex[:24]
    run = await ChatRun.prepare(state, job, rid)
    request["progress"] = run  # the access log's line if the client leaves
    tok = run.m.tokenizer
    with run:
        if not req.stream:
            out = await run.collect()
            message = ResponseMessage(
                content=out.text or (None if out.calls else ""),
                reasoning_content=out.reasoning or None,
                tool_calls=[_tool_call(c, job) for c in out.calls] or None,
            )
            choice = ChatChoice(
                message=message,
                finish_reason=out.done.finish_reason,
                logprobs=chat_logprobs(tok, out.logprobs) if run.params.logprobs else None,
            )
            return _json(
                ChatCompletion(
                    id=rid,
                    model=run.m.model_id,
                    choices=[choice],
                    usage=_usage(run.gen, out.done.completion_tokens),
                ),
                run.headers,
            )
        created = int(time.time())

        def chunk(delta: ChunkDelta, finish=None, logprobs=None) -> bytes:
            choice = ChunkChoice(delta=delta, finish_reason=finish, logprobs=logprobs)
            return sse.data(
                ChatCompletionChunk(id=rid, created=created, model=run.m.model_id, choices=[choice])
            )

        resp = await sse.open_stream(request, run.headers)
        await resp.write(chunk(ChunkDelta(role="assistant", content="")))
        async for ev in run.events():
            if isinstance(ev, Keepalive):
                await resp.write(sse.KEEPALIVE)
            elif isinstance(ev, Delta):
                lp = chat_logprobs(tok, ev.logprobs) if ev.logprobs else None
                delta = (
                    ChunkDelta(reasoning_content=ev.text)
                    if ev.kind == "reasoning"
                    else ChunkDelta(content=ev.text)
                )
                await resp.write(chunk(delta, logprobs=lp))
            elif isinstance(ev, ToolCalls):
                calls = [{"index": c.index, **_tool_call(c, job)} for c in ev.calls]
                await resp.write(chunk(ChunkDelta(tool_calls=calls)))
            elif ev.error is not None:
                await resp.write(
                    sse.data({"error": {"message": ev.error.message, "type": ev.error.type}})
                )
            else:
                await resp.write(chunk(ChunkDelta(), finish=ev.finish_reason))
                if req.include_usage:
                    await resp.write(
                        sse.data(
                            ChatCompletionChunk(
                                id=rid,
                                created=created,
                                model=run.m.model_id,
                                choices=[],
                                usage=_usage(run.gen, ev.completion_tokens),
                            )
                        )
                    )
        await resp.write(sse.DONE)
        return resp


def _tool_call(call: ToolCall, job: ChatJob) -> dict:
    origin = job.tool_origins.get(call.name)
    if origin is not None and origin.custom:  # declared as a custom tool: answered as one
        return {
            "id": call.id,
            "type": "custom",
            "custom": {"name": origin.name, "input": custom_input(call.arguments)},
        }
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


async def completions(request: web.Request) -> web.StreamResponse:
    state: WorkerState = request.app["state"]
    m, engine = state.ready()
    req = parse_model(CompletionRequest, load_json(await request.read()))
    prompt = completion_prompt(m, req)
    params = resolve_params(m, req.to_generation_params(), len(prompt))
    rid = "cmpl-" + uuid.uuid4().hex[:24]
    echo = m.tokenizer.decode(prompt) if req.echo else ""
    key = await make_cache_key(state, prompt, session_of(request, req))
    processors, warning = await row_processors(m, req.to_guided_spec(), state.config)
    warnings = [warning] if warning else []
    if req.suffix:  # no fill-in-the-middle here: say so, as for other ignored constraints
        warnings.append(
            warning_header("suffix", "this server does not fill in the middle", "it was ignored")
        )
    headers = {"Warning": ", ".join(warnings)} if warnings else {}
    progress = request["progress"] = RowProgress()
    with Generation(engine, rid, prompt, params, processors=processors, cache_key=key) as gen:
        progress.gen = gen
        if not req.stream:
            text, last, lps = await gen.collect()
            _raise_if_failed(last)
            choice = CompletionChoice(
                text=echo + text,
                finish_reason=last.finish_reason,
                logprobs=completion_logprobs(m.tokenizer, lps, len(echo))
                if params.logprobs
                else None,
            )
            return _json(
                Completion(
                    id=rid,
                    model=m.model_id,
                    choices=[choice],
                    usage=_usage(gen, last.completion_tokens),
                ),
                headers,
            )
        created = int(time.time())

        def chunk(text: str, finish=None, logprobs=None, usage=None) -> bytes:
            choices = (
                []
                if usage
                else [CompletionChoice(text=text, finish_reason=finish, logprobs=logprobs)]
            )
            return sse.data(
                Completion(id=rid, created=created, model=m.model_id, choices=choices, usage=usage)
            )

        resp = await sse.open_stream(request, headers)
        if echo:
            await resp.write(chunk(echo))
        offset = len(echo)
        while True:
            ev = await gen.next(KEEPALIVE_S)
            if ev is None:
                await resp.write(sse.KEEPALIVE)
                continue
            if ev.error is not None:
                await resp.write(
                    sse.data({"error": {"message": ev.error.message, "type": ev.error.type}})
                )
                break
            progress.completion_tokens = ev.completion_tokens
            lp = completion_logprobs(m.tokenizer, ev.logprobs, offset) if ev.logprobs else None
            offset += len(ev.text)
            if ev.text or lp or ev.finish_reason:
                await resp.write(chunk(ev.text, ev.finish_reason, lp))
            if ev.finish_reason is not None:
                if req.include_usage:
                    await resp.write(chunk("", usage=_usage(gen, ev.completion_tokens)))
                break
        await resp.write(sse.DONE)
        return resp


def _raise_if_failed(ev) -> None:
    if ev.error is not None:
        raise ev.error if isinstance(ev.error, Unavailable) else Unavailable(ev.error.message)
