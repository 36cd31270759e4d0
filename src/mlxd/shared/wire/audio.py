"""Speech-to-text wire bodies: the multipart form of POST /v1/audio/transcriptions and
/v1/audio/translations (OpenAI's fields), and the body the supervisor sends its worker.

The supervisor decodes the upload itself (its bounds are checked there, before any load) and
sends the worker one body: the request's parameters as one line of JSON, a newline, then the
audio as 16 kHz mono signed 16-bit little-endian PCM (what Whisper reads). JSON escapes every
newline inside strings, so the first newline byte ends the parameters.
"""

from __future__ import annotations

from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mlxd.shared.errors import BadRequest

SAMPLE_RATE = 16_000  # samples per second of the PCM a worker gets
SAMPLE_BYTES = 2  # signed 16-bit
MAX_PROMPT_CHARS = 4096  # Whisper reads at most 224 tokens of it; the rest is never used

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
Task = Literal["transcribe", "translate"]
# What each response format is sent as.
CONTENT_TYPES: dict[str, str] = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "text/plain; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


class TranscriptionForm(BaseModel):
    """The form fields of an upload (every value arrives as text: numbers are parsed).
    Fields mlxd does not know are ignored, as clients send extras."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    language: str | None = Field(None, min_length=2, max_length=32)
    prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    response_format: ResponseFormat = "json"
    temperature: float = Field(0.0, ge=0.0, le=1.0)
    timestamp_granularities: list[Literal["segment", "word"]] = ["segment"]
    stream: bool = False

    def to_job(self, task: Task, duration_s: float) -> TranscriptionJob:
        """What the worker needs of this request."""
        return TranscriptionJob(
            task=task,
            language=self.language.lower() if self.language else None,
            prompt=self.prompt or None,
            response_format=self.response_format,
            temperature=self.temperature,
            words="word" in self.timestamp_granularities,
            duration_s=duration_s,
        )


def parse_form(fields: dict[str, str | list[str]]) -> TranscriptionForm:
    """The form's fields as a TranscriptionForm; the first mistake is a 400 naming its field."""
    try:
        form = TranscriptionForm.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        raise BadRequest(f"Invalid '{loc}': {msg}" if loc else msg, param=loc or None) from None
    if form.stream:
        raise BadRequest(
            "Streaming transcriptions are not supported for Whisper models (as in OpenAI's "
            "API, where only the gpt-4o transcribe models stream); leave 'stream' unset",
            param="stream",
        )
    if "word" in form.timestamp_granularities and form.response_format != "verbose_json":
        raise BadRequest(
            "Invalid 'timestamp_granularities': word timestamps need "
            "response_format = 'verbose_json'",
            param="timestamp_granularities",
        )
    return form


class TranscriptionJob(BaseModel):
    """What the supervisor asks of a speech worker, with the decoded audio beside it."""

    task: Task
    language: str | None = None
    prompt: str | None = None
    response_format: ResponseFormat = "json"
    temperature: float = 0.0
    words: bool = False  # word-level timestamps (verbose_json)
    duration_s: float = 0.0


def pack(job: TranscriptionJob, pcm: bytes) -> bytes:
    """The worker's request body: the job as one JSON line, then the PCM bytes."""
    return orjson.dumps(job.model_dump()) + b"\n" + pcm


def unpack(body: bytes) -> tuple[TranscriptionJob, bytes]:
    """The job and PCM of a worker request body (a 400 for a malformed one)."""
    head, sep, pcm = body.partition(b"\n")
    if not sep:
        raise BadRequest("The audio request has no parameters line")
    try:
        job = TranscriptionJob.model_validate(orjson.loads(head))
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise BadRequest(f"Invalid audio request parameters: {exc}") from None
    if len(pcm) % SAMPLE_BYTES:
        raise BadRequest("The audio request's PCM is not whole 16-bit samples")
    return job, pcm
