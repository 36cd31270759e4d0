"""Each sampling parameter is declared once (shared/sampling.py): every surface, the config
section and the worker spec take it with the same bounds, and a request's value reaches the
engine's parameters from every surface."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from mlxd.shared.config import ModelSettings
from mlxd.shared.params import GenerationParams
from mlxd.shared.sampling import BUILTIN, NAMES, SamplingFields, resolve
from mlxd.shared.wire.anthropic import MessagesRequest
from mlxd.shared.wire.completions import CompletionRequest
from mlxd.shared.wire.ollama import ChatRequest
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.shared.wire.responses import ResponsesRequest
from mlxd.shared.worker_spec import MODEL_DEFAULT_FIELDS, WorkerSpec

MSG = [{"role": "user", "content": "hi"}]
VALUES = {"temperature": 0.5, "top_p": 0.75, "top_k": 7, "min_p": 0.125}
SURFACES = {
    "openai": lambda v: ChatCompletionRequest.model_validate({"messages": MSG, **v}),
    "completions": lambda v: CompletionRequest.model_validate({"prompt": "hi", **v}),
    "anthropic": lambda v: MessagesRequest.model_validate({"max_tokens": 9, "messages": MSG, **v}),
    "responses": lambda v: ResponsesRequest.model_validate({"input": "hi", **v}),
    "ollama": lambda v: ChatRequest.model_validate({"model": "m", "messages": MSG, "options": v}),
}


def test_every_parameter_is_everywhere_it_must_be():
    assert set(NAMES) == set(VALUES) == set(BUILTIN)
    engine = {f.name for f in dataclasses.fields(GenerationParams)}
    for name in NAMES:
        assert name in engine and name in MODEL_DEFAULT_FIELDS
        for model in (ModelSettings, WorkerSpec, ChatCompletionRequest, MessagesRequest):
            assert name in model.model_fields, (model.__name__, name)


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_a_requests_values_reach_the_engine_from_every_surface(surface):
    params = SURFACES[surface](VALUES).to_chat_job().params
    assert {n: getattr(params, n) for n in NAMES} == VALUES


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_the_bounds_are_the_declarations_on_every_surface(surface):
    for bad in ({"top_p": 0.0}, {"min_p": 1.5}, {"top_k": -2}, {"temperature": -0.1}):
        with pytest.raises(ValidationError):
            SURFACES[surface](bad)
    with pytest.raises(ValidationError):
        ModelSettings(top_p=0.0)
    assert SamplingFields.model_fields["temperature"].metadata  # bounds live on the field


def test_anthropic_keeps_its_own_temperature_bound():
    with pytest.raises(ValidationError):
        SURFACES["anthropic"]({"temperature": 1.5})
    assert SURFACES["openai"]({"temperature": 1.5}).temperature == 1.5


def test_the_request_wins_then_the_section_then_the_folder_then_the_built_ins():
    got = resolve({"temperature": 0.1, "top_k": -1}, {"top_k": 5, "top_p": 0.9}, {"top_p": 0.5})
    assert got == {"temperature": 0.1, "top_p": 0.9, "top_k": 5, "min_p": BUILTIN["min_p"]}
