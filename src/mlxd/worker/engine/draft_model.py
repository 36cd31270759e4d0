"""The draft model of speculative decoding: loaded next to the target, refused unless both
read text the same way (a draft's token ids are the target's: one vocabulary, one mapping)."""

from __future__ import annotations

from pathlib import Path

from mlxd.worker.engine.step.speculate import SpecConfig
from mlxd.worker.model.load import LoadedModel, load_model


class DraftMismatch(ValueError):
    """The draft model's tokenizer is not the target's."""


def load_draft(path: Path, target: LoadedModel) -> LoadedModel:
    """The draft model at `path`; raises DraftMismatch when its vocabulary differs."""
    draft = load_model(path, f"{target.model_id}:draft", target.context_limit)
    check_tokenizers(target.tokenizer, draft.tokenizer, path)
    return draft


def check_tokenizers(target, draft, path: Path) -> None:
    """Same vocabulary, same ids: else a DraftMismatch naming the first difference."""
    mine, theirs = target.get_vocab(), draft.get_vocab()
    if mine == theirs:
        return
    if len(mine) != len(theirs):
        raise DraftMismatch(
            f"draft model {path.name}: its tokenizer has {len(theirs)} tokens, "
            f"the target's {len(mine)}; speculative decoding needs the same tokenizer"
        )
    token = next(t for t in sorted(mine) if theirs.get(t) != mine[t])
    raise DraftMismatch(
        f"draft model {path.name}: token {token!r} is id {theirs.get(token)} there and "
        f"{mine[token]} in the target; speculative decoding needs the same tokenizer"
    )


def spec_config(mode: str, k: int, draft: LoadedModel | None) -> SpecConfig | None:
    """The engine's speculative setting (None: off)."""
    if mode == "off" or mode == "draft" and draft is None:
        return None
    return SpecConfig(mode, k, draft.model if draft else None)
