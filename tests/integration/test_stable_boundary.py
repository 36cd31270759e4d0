"""Where a conversation's next turn starts (cache/keys.py stable_boundary), for window and
hybrid models' snapshots: from the primer alone where it starts with a special token, the
same boundary as encoding the whole conversation again; the whole encode elsewhere."""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxd.worker.cache.keys import stable_boundary

WORDS = "The harbor town kept its lighthouse lit through every storm.  " * 200
CONVERSATIONS = [
    [{"role": "user", "content": WORDS}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": WORDS},
        {"role": "assistant", "content": "Fine.  "},
        {"role": "user", "content": "again\n"},
    ],
]
# A template whose generation primer is plain text: no special token to split at.
PLAIN_PRIMER = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def encoded_chars(tok) -> list[int]:
    """Records the length of every text `tok` encodes from now on."""
    seen: list[int] = []
    hf = tok._tokenizer
    encode = hf.encode

    def counted(text, *a, **kw):
        seen.append(len(text))
        return encode(text, *a, **kw)

    hf.encode = counted
    return seen


@pytest.mark.parametrize("template", ["model's", "plain primer"])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one turn", "four turns"])
def test_the_boundary_is_the_whole_encodes_and_the_primer_alone_is_encoded(
    tokenizer, template, messages
):
    kwargs = {} if template == "model's" else {"chat_template": PLAIN_PRIMER}
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **kwargs
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    whole = stable_boundary(tokenizer, messages, kwargs, ids)  # no text: the whole encode
    seen = encoded_chars(tokenizer)
    try:
        assert stable_boundary(tokenizer, messages, kwargs, ids, text) == whole
    finally:
        del tokenizer._tokenizer.encode
    assert 0 < whole < len(ids)
    if template == "model's":  # ChatML: the primer starts with <|im_start|>
        assert seen == [len("<|im_start|>assistant\n")]
    else:  # no special token first: the conversation is encoded again
        assert max(seen) > len(WORDS)
