"""Every surface carries images in its own wire form to one neutral form: `ChatJob.images` in
order of appearance, and the message's content as text and image parts (issue #35)."""

from __future__ import annotations

import base64

import pytest

from mlxd.shared.chat_job import ChatJob, fold_system_messages, refuse_images
from mlxd.shared.errors import BadRequest
from mlxd.shared.images import decode_base64
from mlxd.shared.params import GenerationParams
from mlxd.shared.wire.anthropic import CountTokensRequest, MessagesRequest
from mlxd.shared.wire.bodies import parse_model
from mlxd.shared.wire.completions import CompletionRequest
from mlxd.shared.wire.ollama import ChatRequest, GenerateRequest
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.shared.wire.responses import ResponsesRequest

PNG_A = b"\x89PNG\r\n\x1a\n-first"  # the wire layer carries bytes; checking is test_image_checks
PNG_B = b"\x89PNG\r\n\x1a\n-second"
B64_A, B64_B = base64.b64encode(PNG_A).decode(), base64.b64encode(PNG_B).decode()
DATA_A, DATA_B = f"data:image/png;base64,{B64_A}", f"data:image/jpeg;base64,{B64_B}"
URL = "https://example.com/cat.png"
IMG, TXT = {"type": "image"}, lambda t: {"type": "text", "text": t}


def openai(messages, **kw) -> ChatJob:
    return parse_model(ChatCompletionRequest, {"messages": messages, **kw}).to_chat_job()


def anthropic(messages, **kw) -> ChatJob:
    body = {"max_tokens": 10, "messages": messages, **kw}
    return parse_model(MessagesRequest, body).to_chat_job()


def responses(items, **kw) -> ChatJob:
    return parse_model(ResponsesRequest, {"input": items, **kw}).to_chat_job()


def image_url(url, **extra):
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def refused(call, param: str, says: str) -> BadRequest:
    with pytest.raises(BadRequest) as err:
        call()
    assert err.value.param == param, err.value.message
    assert says in err.value.message
    return err.value


# -- OpenAI chat --------------------------------------------------------------------------
def test_openai_image_url_parts_become_images_in_order_across_messages():
    job = openai(
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [TXT("Compare "), image_url(DATA_A, detail="high"), TXT(" and")],
            },
            {"role": "assistant", "content": "Which?"},
            {"role": "user", "content": [image_url(URL, detail="low"), TXT("this one")]},
        ]
    )
    assert [m["content"] for m in job.messages] == [
        "Be brief.",
        [TXT("Compare "), IMG, TXT(" and")],
        "Which?",
        [IMG, TXT("this one")],
    ]
    assert [(i.data, i.url, i.param) for i in job.images] == [
        (PNG_A, None, "messages.1.content.1.image_url"),
        (None, URL, "messages.3.content.0.image_url"),
    ]


def test_text_only_requests_are_unchanged():
    job = openai([{"role": "user", "content": [TXT("a"), TXT("b")]}])
    assert job.messages == [{"role": "user", "content": "ab"}] and job.images == []
    job = anthropic([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert job.messages == [{"role": "user", "content": "hi"}] and job.images == []
    job = responses([{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}])
    assert job.messages == [{"role": "user", "content": "hi"}] and job.images == []
    ollama = parse_model(
        ChatRequest, {"model": "a", "messages": [{"role": "user", "content": "x"}]}
    )
    assert ollama.to_chat_job().messages == [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    "url,says",
    [
        ("file:///etc/passwd", "data: URL (base64) or an http(s) URL"),
        ("data:image/png,notbase64", "must be base64"),
        ("data:image/png;base64", "needs a ','"),
        ("data:application/pdf;base64,JVBERi0=", "unsupported image type 'application/pdf'"),
        ("data:image/png;base64,***", "not valid base64"),
        ("data:image/png;base64,", "empty"),
        ("", "give the image"),
    ],
)
def test_openai_bad_image_urls_are_400s_naming_the_part(url, says):
    msgs = [{"role": "user", "content": [TXT("x"), image_url(url)]}]
    refused(lambda: openai(msgs), "messages.0.content.1.image_url", says)


def test_openai_images_outside_user_messages_are_refused():
    for role in ("system", "developer", "assistant", "tool"):
        msgs = [{"role": role, "content": [image_url(DATA_A)]}, {"role": "user", "content": "x"}]
        refused(lambda msgs=msgs: openai(msgs), "messages.0.content", "user messages only")


def test_openai_other_parts_are_still_refused():
    msgs = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]
    refused(lambda: openai(msgs), "messages.0.content.0", "'input_audio' is not supported")


def test_completions_stay_text_only():
    body = {"prompt": [image_url(DATA_A)]}
    with pytest.raises(BadRequest):
        parse_model(CompletionRequest, body)
    job = parse_model(CompletionRequest, {"prompt": "hi"}).to_chat_job()
    assert job.images == [] and job.raw is not None


# -- Anthropic Messages -------------------------------------------------------------------
def b64_block(data=B64_A, media_type="image/png"):
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def test_anthropic_base64_and_url_images_become_parts_after_tool_results():
    job = anthropic(
        [
            {"role": "user", "content": [b64_block(), {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "done"},
                    {"type": "text", "text": "and "},
                    {"type": "image", "source": {"type": "url", "url": URL}},
                ],
            },
        ]
    )
    assert job.messages[0] == {"role": "user", "content": [IMG, TXT("What?")]}
    assert job.messages[2] == {"role": "tool", "tool_call_id": "t", "content": "done"}
    assert job.messages[3] == {"role": "user", "content": [TXT("and "), IMG]}
    assert [(i.data, i.url, i.param) for i in job.images] == [
        (PNG_A, None, "messages.0.content.0.source.data"),
        (None, URL, "messages.2.content.2.source.url"),
    ]


def test_anthropic_tool_result_images_join_the_user_turn_after_the_results():
    result = {
        "type": "tool_result",
        "tool_use_id": "t",
        "content": [{"type": "text", "text": "a screenshot:"}, b64_block(B64_B)],
    }
    job = anthropic([{"role": "user", "content": [result, {"type": "text", "text": "Fix it"}]}])
    assert job.messages == [
        {"role": "tool", "tool_call_id": "t", "content": "a screenshot:"},
        {"role": "user", "content": [IMG, TXT("Fix it")]},
    ]
    assert [(i.data, i.param) for i in job.images] == [
        (PNG_B, "messages.0.content.0.content.1.source.data")
    ]
    only = anthropic([{"role": "user", "content": [{**result, "content": [b64_block()]}]}])
    assert only.messages == [
        {"role": "tool", "tool_call_id": "t", "content": ""},
        {"role": "user", "content": [IMG]},
    ]


def test_anthropic_count_tokens_carries_images_too():
    body = {"messages": [{"role": "user", "content": [b64_block()]}]}
    assert len(parse_model(CountTokensRequest, body).to_chat_job().images) == 1


@pytest.mark.parametrize(
    "block,param,says",
    [
        (b64_block(media_type="image/tiff"), "messages.0.content.0.source", "'image/tiff'"),
        (b64_block(data="@@@"), "messages.0.content.0.source.data", "not valid base64"),
        (
            {"type": "image", "source": {"type": "file", "file_id": "f_1"}},
            "messages.0.content.0.source",
            "file ids are not supported",
        ),
        ({"type": "image", "source": {}}, "messages.0.content.0.source", "base64 or url"),
        (
            {"type": "image", "source": {"type": "url", "url": "ftp://x/y.png"}},
            "messages.0.content.0.source.url",
            "http(s) URL",
        ),
        (
            {"type": "tool_result", "tool_use_id": "t", "content": [b64_block(data="?")]},
            "messages.0.content.0.content.0.source.data",
            "not valid base64",
        ),
    ],
)
def test_anthropic_bad_image_blocks(block, param, says):
    refused(lambda: anthropic([{"role": "user", "content": [block]}]), param, says)


def test_anthropic_images_in_system_or_assistant_are_refused():
    refused(
        lambda: anthropic([{"role": "user", "content": "x"}], system=[b64_block()]),
        "system",
        "user messages only",
    )
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": [b64_block()]}]
    refused(lambda: anthropic(msgs), "messages.1.content.0", "user messages only")
    msgs = [{"role": "system", "content": [b64_block()]}, {"role": "user", "content": "x"}]
    refused(lambda: anthropic(msgs), "messages.0.content", "user messages only")


# -- Responses ----------------------------------------------------------------------------
def test_responses_input_image_parts():
    job = responses(
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look: "},
                    {"type": "input_image", "image_url": DATA_B, "detail": "auto"},
                ],
            }
        ],
        instructions="Be brief.",
    )
    assert job.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [TXT("Look: "), IMG]},
    ]
    assert [(i.data, i.param) for i in job.images] == [(PNG_B, "input.0.content.1.image_url")]


def test_responses_bad_images():
    item = {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}
    refused(lambda: responses([item]), "input.0.content.0.file_id", "file ids are not supported")
    item = {"role": "developer", "content": [{"type": "input_image", "image_url": DATA_A}]}
    refused(lambda: responses([item]), "input.0.content", "user messages only")
    item = {"role": "user", "content": [{"type": "input_image", "image_url": "junk"}]}
    refused(lambda: responses([item]), "input.0.content.0.image_url", "http(s) URL")


# -- Ollama -------------------------------------------------------------------------------
def test_ollama_chat_images_go_first_then_the_text():
    body = {
        "model": "a",
        "messages": [
            {"role": "user", "content": "Compare", "images": [B64_A, B64_B]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "", "images": [DATA_A]},
        ],
    }
    job = parse_model(ChatRequest, body).to_chat_job()
    assert [m["content"] for m in job.messages] == [[IMG, IMG, TXT("Compare")], "ok", [IMG]]
    assert [(i.data, i.param) for i in job.images] == [
        (PNG_A, "messages.0.images.0"),
        (PNG_B, "messages.0.images.1"),
        (PNG_A, "messages.2.images.0"),
    ]


def test_ollama_generate_images_make_a_user_message():
    body = {"model": "a", "prompt": "What is it?", "system": "Be brief.", "images": [B64_A]}
    job = parse_model(GenerateRequest, body).to_chat_job()
    assert job.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [IMG, TXT("What is it?")]},
    ]
    assert [(i.data, i.param) for i in job.images] == [(PNG_A, "images.0")]
    raw = {**body, "raw": True}
    refused(lambda: parse_model(GenerateRequest, raw).to_chat_job(), "images", "raw prompt")


def test_ollama_bad_images():
    msgs = [{"role": "system", "content": "x", "images": [B64_A]}]
    refused(
        lambda: parse_model(ChatRequest, {"model": "a", "messages": msgs}).to_chat_job(),
        "messages.0.images",
        "user messages only",
    )
    msgs = [{"role": "user", "content": "x", "images": [B64_A, "not base64!"]}]
    refused(
        lambda: parse_model(ChatRequest, {"model": "a", "messages": msgs}).to_chat_job(),
        "messages.0.images.1",
        "not valid base64",
    )
    with pytest.raises(BadRequest, match="images"):  # not a string at all
        parse_model(ChatRequest, {"model": "a", "messages": [{**msgs[0], "images": [1]}]})


# -- the neutral form's helpers -----------------------------------------------------------
def test_a_base64_string_over_the_bound_is_refused_by_its_length():
    huge = "A" * (100 * 1024 * 1024)  # 100 MB of base64: refused before decoding
    refused(lambda: decode_base64(huge, "p", max_bytes=20 * 1024 * 1024), "p", "over 20971520")
    assert decode_base64("aGloaGlo", "p", max_bytes=6) == b"hihhih"  # at the bound: fine
    refused(lambda: decode_base64("aGloaGlo", "p", max_bytes=5), "p", "over 5 bytes")
    assert decode_base64("aGlo\naGlo\n", "p") == b"hihhih"  # MIME line breaks are fine
    assert decode_base64("aGk", "p") == b"hi"  # padding left out: put back
    refused(lambda: decode_base64("aG=k", "p"), "p", "not valid base64")
    refused(lambda: decode_base64("aGk\u00e9", "p"), "p", "not valid base64")


def test_refuse_images_names_the_model_and_the_capability():
    job = openai([{"role": "user", "content": [image_url(DATA_A)]}])
    err = refused(
        lambda: refuse_images(job, "qwen3-0.6b"),
        "messages.0.content.0.image_url",
        "model 'qwen3-0.6b' does not accept images: it has no vision capability",
    )
    assert err.status == 400
    refuse_images(ChatJob(messages=[], params=GenerationParams()), "qwen3-0.6b")  # no images


def test_late_system_messages_fold_into_a_user_turn_with_images():
    msgs = [
        {"role": "user", "content": [IMG, TXT("what?")]},
        {"role": "system", "content": "note"},
        {"role": "user", "content": [TXT("and"), IMG]},
    ]
    folded = fold_system_messages(msgs)
    assert folded[1]["content"] == [TXT("<system_note>\nnote\n</system_note>\n\n"), TXT("and"), IMG]
    folded = fold_system_messages(msgs[:2])  # no user turn after: at the end of the last one
    assert folded[0]["content"] == [
        IMG,
        TXT("what?"),
        TXT("\n\n<system_note>\nnote\n</system_note>"),
    ]
