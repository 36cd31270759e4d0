"""Where a preempted row's sampling key goes back to (engine/sched/preempt.py `park`).

A decoding row always has its next token drawn before the step that returns it. Parked then,
that token was not sent: the resumption draws it again, so the key goes back one draw. A
token sent at the end of the step that drew it (emit.send_first) is among the tokens the
resumption starts from: drawing it again would send it twice, so the key stays.
"""

from __future__ import annotations

import types

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.rows import Row, Submission
from mlxd.worker.engine.sched.preempt import park


class _Batch:
    def __init__(self):
        self.parked: list[Row] = []

    def park(self, row: Row) -> None:
        self.parked.append(row)


def _row(sent_ahead: bool) -> Row:
    sub = Submission("r", [1, 2, 3], GenerationParams(max_tokens=8, seed=7), lambda ev: None)
    sampling = types.SimpleNamespace(key="after-draw", prev_key="before-draw")
    sampler = types.SimpleNamespace(sampling=sampling)
    row = Row(sub=sub, uid=1, text=None, sampler=sampler)  # type: ignore[arg-type]
    row.started, row.todo, row.generated, row.sent_ahead = True, 0, 1, sent_ahead
    return row


def test_a_drawn_token_not_sent_is_drawn_again_after_the_resumption():
    batch, row = _Batch(), _row(sent_ahead=False)
    park(batch, row)  # type: ignore[arg-type]
    assert row.sampler.sampling.key == "before-draw"
    assert batch.parked == [row]


def test_a_token_sent_ahead_is_not_drawn_again():
    batch, row = _Batch(), _row(sent_ahead=True)
    park(batch, row)  # type: ignore[arg-type]
    assert row.sampler.sampling.key == "after-draw"
    assert batch.parked == [row]
