"""A chat with images: checked, then rendered through the model's processor (worker/vision/)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from mlxd.shared.chat_job import ChatJob, refuse_images
from mlxd.shared.errors import BadRequest
from mlxd.worker.chat.images import resolve_images
from mlxd.worker.chat.prompts import ChatPrompt
from mlxd.worker.vision.prompt import VisionInput, process


async def with_images(state, job: ChatJob, prompt: ChatPrompt) -> tuple[ChatPrompt, VisionInput]:
    """`prompt` with its images in (the ids the engine runs) and the row's VisionInput; a
    400 for a text-only model, a bad image, or a text that spells the image marker."""
    vision = state.vision
    if vision is None:
        refuse_images(job, state.config.model_id)
    assert vision is not None  # refuse_images raised
    checked = await resolve_images(job, state.config.image_limits, memo=state.images)
    try:
        ids, vin = await asyncio.to_thread(
            process, vision, prompt.text, [c.image for c in checked], [c.sha256 for c in checked]
        )
    except ValueError as exc:
        raise BadRequest(f"Invalid image input: {exc}", param="messages") from exc
    return replace(prompt, ids=ids), vin
