"""The Ollama API's model listings on the supervisor's port: /api/version, /api/tags, /api/ps
and /api/show, answered from the catalog and the lifecycle without a worker; and what every
Ollama route shares (ollama.py): the model an Ollama name means, a JSON answer.
"""

from __future__ import annotations

import time

import orjson
from aiohttp import web
from pydantic import BaseModel

from mlxd.shared.config import is_template_text
from mlxd.shared.errors import BadRequest, ModelNotFound, NotFound, closest
from mlxd.shared.model_facts import ModelFacts
from mlxd.shared.sampling import resolve_defaults
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.shared.wire.ollama import ModelRequest, model_id_of
from mlxd.shared.wire.ollama_answers import (
    OLLAMA_VERSION,
    ModelDetails,
    Running,
    RunningModel,
    ShowAnswer,
    TagModel,
    Tags,
    ollama_name,
    timestamp,
)
from mlxd.shared.worker_spec import MODEL_DEFAULT_FIELDS
from mlxd.supervisor.catalog.cards import facts_of
from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.catalog.folder_info import FolderInfo, folder_info
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.registry.adapters import check_mounted
from mlxd.supervisor.registry.registry import Registry

FOREVER_S = 292 * 365.25 * 86400  # what Ollama shows as a keep_alive of -1's expiry
LOADED = (State.READY, State.DRAINING)


def json_response(body: BaseModel | dict) -> web.Response:
    """An Ollama answer: a wire body (or a plain dict) as JSON, through orjson."""
    data = body.model_dump() if isinstance(body, BaseModel) else body
    return web.Response(body=orjson.dumps(data), content_type="application/json")


async def entry_for(
    reg: Registry, name: str, adapters: str | None = None, param: str = "model"
) -> ModelEntry:
    """The catalog entry an Ollama name means ("a:latest" is "a"); 404 in Ollama's words.

    A name that means a LoRA adapter ("a:sql") is a 404 unless it is mounted on its model,
    and then that model's entry only where `adapters` is None (show: an adapter is its
    base's card); else a 400 saying `adapters` (what acts on a whole model: delete, copy,
    create from, embed, must never act on the base an adapter name reached)."""
    entry, adapter = await route_for(reg, name)
    check_mounted(reg, entry.id, adapter, param)
    if adapter is not None and adapters is not None:
        what = f"'{name[:200]}' is the LoRA adapter '{adapter}' on '{entry.id}', not a model"
        raise BadRequest(f"{what}: {adapters.format(model=entry.id, adapter=adapter)}", param=param)
    return entry


async def route_for(
    reg: Registry, name: str, adapter: object = None
) -> tuple[ModelEntry, str | None]:
    """The entry and LoRA adapter an Ollama name means: "a:latest" is "a"; "a:sql" is
    adapter "sql" on "a" when "a:sql" is no model's id (Catalog.route)."""
    for candidate in dict.fromkeys((name, model_id_of(name))):
        await reg.catalog.settle(candidate)
        try:
            return reg.catalog.route(candidate, adapter)
        except ModelNotFound:
            continue
    # Suggested as Ollama names ("x:latest"), matched on the id the name means.
    near = closest(model_id_of(name), reg.catalog.known_names())
    hint = f" (did you mean '{ollama_name(near)}'?)" if near is not None else ""
    raise NotFound(f"model '{name[:200]}' not found{hint}", param="model", code="model_not_found")


def _capabilities(info: FolderInfo, facts: ModelFacts) -> list[str]:
    """Ollama's capability names: an embedding model's ["embedding"] (as Ollama answers),
    a speech model's ["transcription"] (so neither is offered as a chat model), else what
    the chat template shows."""
    return [facts.type] if facts.type != "chat" else info.capabilities


def _details(info: FolderInfo) -> ModelDetails:
    return ModelDetails(
        family=info.family,
        families=[info.family] if info.family else None,
        parameter_size=info.parameter_size,
        quantization_level=info.quantization,
    )


def _tag(entry: ModelEntry, info: FolderInfo) -> TagModel:
    name = ollama_name(entry.id)
    return TagModel(
        name=name,
        model=name,
        modified_at=timestamp(info.modified),
        size=entry.weights_bytes,
        digest=info.digest,
        details=_details(info),
    )


async def version(request: web.Request) -> web.Response:
    return json_response({"version": OLLAMA_VERSION})


async def tags(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    entries = reg.catalog.entries()
    models = [_tag(e, folder_info(e.path)) for _, e in sorted(entries.items())]
    return json_response(Tags(models=models))


async def ps(request: web.Request) -> web.Response:
    """Loaded models and when their keep-alive unloads them."""
    reg: Registry = request.app["registry"]
    now, wall = reg.lifecycle.clock(), time.time()
    models = []
    for _, slot in sorted(reg.lifecycle.slots.items()):
        if slot.state not in LOADED:
            continue
        info = folder_info(slot.entry.path)
        keep = slot.keep_alive_s
        if keep < 0 or slot.settings.pinned:
            left = FOREVER_S
        else:  # a busy model's keep-alive starts when its last request ends
            left = keep if slot.leases else keep - (now - slot.last_used)
        tag = _tag(slot.entry, info)
        held = slot.memory.total_bytes  # the one figure mlxctl ps and /admin/memory show
        models.append(
            RunningModel(
                **tag.model_dump(exclude={"size", "details"}),
                details=tag.details,
                size=held,
                size_vram=held,  # unified memory: all of it is the GPU's
                expires_at=timestamp(wall + min(FOREVER_S, max(0.0, left))),
                context_length=slot.settings.context_limit or info.context_length,
            )
        )
    return json_response(Running(models=models))


async def show(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    req = parse_model(ModelRequest, load_json(await request.read()))
    entry = await entry_for(reg, req.model_name)
    info = folder_info(entry.path)
    ms = reg.settings.for_model(entry.id)
    context = ms.context_limit or info.context_length
    # What a silent request gets (shared/sampling.py), as the worker resolves it
    section = {name: getattr(ms, name) for name in MODEL_DEFAULT_FIELDS}
    defaults = resolve_defaults(entry.path, section)
    shown = {**info.defaults, **defaults.sampling}
    params = "\n".join(f"{k:<30} {v}" for k, v in shown.items())
    fam, cfg = info.family or "model", info.config
    model_info = {
        "general.architecture": info.family,
        "general.basename": entry.id,
        "general.parameter_count": info.parameters,
        f"{fam}.context_length": context,
        f"{fam}.embedding_length": cfg.get("hidden_size"),
        f"{fam}.block_count": cfg.get("num_hidden_layers"),
        f"{fam}.attention.head_count": cfg.get("num_attention_heads"),
        f"{fam}.attention.head_count_kv": cfg.get("num_key_value_heads"),
        f"{fam}.vocab_size": cfg.get("vocab_size"),
    }
    answer = ShowAnswer(
        modelfile=f"# mlxd model '{entry.id}' ({entry.source})\nFROM {entry.id}\n"
        + "".join(f"PARAMETER {k} {v}\n" for k, v in shown.items())
        + (f"SYSTEM {orjson.dumps(defaults.system).decode()}\n" if defaults.system else ""),
        parameters=params,
        template=ms.chat_template
        if ms.chat_template and is_template_text(ms.chat_template)
        else info.template,
        details=_details(info),
        model_info={k: v for k, v in model_info.items() if v is not None},
        capabilities=_capabilities(info, facts_of(entry, reg.settings)),
        modified_at=timestamp(info.modified),
    )
    return json_response(answer)
