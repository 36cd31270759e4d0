"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's multipart upload, read
and bounded here, the audio decoded here (audio_decode.py), then one body to the worker of a
speech-to-text model (shared/wire/audio.py).

Every check happens before a lease: the form's fields, the model's kind (a chat model is a
400 and loads nothing), the file's size, format and duration. A speech worker transcribes
one request at a time; others wait in its queue, as leases wait for any worker.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.streams import StreamReader

from mlxd.shared.errors import BadRequest, PayloadTooLarge
from mlxd.shared.logs import bind_log_context
from mlxd.shared.wire.audio import Task, pack, parse_form
from mlxd.supervisor.catalog.cards import check_route
from mlxd.supervisor.http.audio_decode import decode
from mlxd.supervisor.http.proxy import forward_leased
from mlxd.supervisor.registry.registry import Registry

log = logging.getLogger("mlxd.audio")

MAX_AUDIO_BYTES = 25 * 1024 * 1024  # OpenAI's own bound on an upload
MAX_AUDIO_S = 30 * 60.0  # the longest audio one request may transcribe
MAX_FIELD_BYTES = 16 * 1024  # one form field other than the file
MAX_FIELDS = 32
# The worker's body: the job's JSON line, then PCM (shared/wire/audio.py).
WORKER_BODY_TYPE = "application/x-mlxd-audio"
# request[AUDIO_SECONDS]: the seconds of audio a request transcribed (the metrics count them).
AUDIO_SECONDS = "audio_seconds"


@dataclass
class Upload:
    """The form's file and its other fields (a repeated field, or one named `x[]`, is a list)."""

    data: bytes = b""
    filename: str = ""
    fields: dict[str, str | list[str]] = field(default_factory=dict)


async def _read_part(part: BodyPartReader, limit: int) -> bytes:
    out = bytearray()
    while chunk := await part.read_chunk(64 * 1024):
        out += chunk
        if len(out) > limit:
            return bytes(out)  # the caller sees it is over and says which bound
    return bytes(out)


def _reader(headers, body: bytes) -> MultipartReader:
    """aiohttp's multipart reader over a body already read (the body deadline reads every
    body, within the server's size limit, before a handler runs)."""
    loop = asyncio.get_running_loop()
    # A limit above the body's size: feeding it all at once never pauses a (fake) transport.
    stream = StreamReader(BaseProtocol(loop), max(len(body), 1 << 16), loop=loop)
    stream.feed_data(body)
    stream.feed_eof()
    return MultipartReader(headers, stream)


async def read_upload(request: web.Request) -> Upload:
    """The multipart form, every part bounded as it is read (the guard lets no other type of
    body reach these routes: guard.content_type_refusal)."""
    try:
        reader = _reader(request.headers, await request.read())
    except (ValueError, AssertionError) as exc:
        raise BadRequest(f"Invalid multipart body: {exc}") from None
    up, seen = Upload(), 0
    while True:
        try:
            part = await reader.next()
        except ValueError as exc:
            raise BadRequest(f"Invalid multipart body: {exc}") from None
        if part is None:
            break
        if not isinstance(part, BodyPartReader):
            raise BadRequest("Nested multipart bodies are not supported")
        seen += 1
        if seen > MAX_FIELDS:
            raise BadRequest(f"The form has over {MAX_FIELDS} fields")
        name = part.name or ""
        if name == "file":
            up.data = await _read_part(part, MAX_AUDIO_BYTES)
            up.filename = part.filename or "file"
            if len(up.data) > MAX_AUDIO_BYTES:
                raise PayloadTooLarge(
                    f"The audio file is over {MAX_AUDIO_BYTES // (1024 * 1024)} MiB; "
                    "please send a smaller one",
                    param="file",
                )
            continue
        raw = await _read_part(part, MAX_FIELD_BYTES)
        if len(raw) > MAX_FIELD_BYTES:
            raise BadRequest(f"Invalid '{name[:40]}': over {MAX_FIELD_BYTES} bytes", param=name)
        _add_field(up.fields, name, raw.decode("utf-8", errors="replace"))
    if not up.data:
        raise BadRequest("The form has no 'file' part, or it is empty", param="file")
    return up


def _add_field(fields: dict[str, str | list[str]], name: str, value: str) -> None:
    key = name.removesuffix("[]")
    old = fields.get(key)
    if name.endswith("[]") or old is not None:  # a list field (OpenAI's `x[]`) or a repeat
        fields[key] = [*([old] if isinstance(old, str) else old or []), value]
    else:
        fields[key] = value


async def _transcribe(request: web.Request, task: Task) -> web.StreamResponse:
    reg: Registry = request.app["registry"]
    up = await read_upload(request)
    form = parse_form(up.fields)
    await reg.catalog.settle(form.model)
    entry = reg.catalog.resolve(form.model)
    request["model"] = entry.id  # the metrics label, also when the lease fails
    bind_log_context(model=entry.id)
    check_route(entry, reg.settings, request.path)  # a wrong kind of model loads nothing
    audio = await decode(up.data, up.filename, MAX_AUDIO_S)
    log.info(
        "audio model=%s task=%s format=%s seconds=%.1f request_id=%s",
        entry.id,
        task,
        audio.format,
        audio.duration_s,
        request["request_id"],
    )
    body = pack(form.to_job(task, audio.duration_s), audio.pcm)
    resp = await forward_leased(request, reg, entry.id, body, content_type=WORKER_BODY_TYPE)
    if resp.status == 200:
        request[AUDIO_SECONDS] = audio.duration_s
    return resp


async def transcriptions(request: web.Request) -> web.StreamResponse:
    """POST /v1/audio/transcriptions: text in the audio's own language."""
    return await _transcribe(request, "transcribe")


async def translations(request: web.Request) -> web.StreamResponse:
    """POST /v1/audio/translations: English text of audio in any language."""
    return await _transcribe(request, "translate")


def add_audio_routes(app: web.Application) -> None:
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/translations", translations)
