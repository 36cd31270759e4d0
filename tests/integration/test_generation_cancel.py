"""A client that leaves always ends its row (the engine in process, its real asyncio side).

The worker cancels a request's handler when its client leaves; the handler's way out of
`Generation` cancels the row. A cancel that lands in the same loop iteration as the row's next
event was swallowed by `asyncio.wait_for` (before Python 3.12): the handler went on and the
row generated to its end for nobody (rows active with no lease after a disconnect storm).
"""

from __future__ import annotations

import asyncio
import gc

from mlxd.shared.params import GenerationParams
from mlxd.worker.chat.generation import Generation
from mlxd.worker.engine.loop import Engine
from mlxd.worker.model.load import load_model

MAX_TOKENS = 300


async def serve_row(gen: Generation, seen: list) -> None:
    """What a request handler does with its row: read events until the row ends."""
    with gen:
        while True:
            ev = await gen.next(timeout_s=30.0)
            if ev is None:
                continue
            seen.append(ev)
            if ev.finish_reason is not None:
                return


def test_a_cancel_landing_with_an_event_ends_the_row(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir, "tiny"), batch=2, warmup=False)
    engine.start()

    async def main(engine: Engine) -> None:
        seen: list = []
        params = GenerationParams(max_tokens=MAX_TOKENS, temperature=0.0, top_p=1.0, top_k=0)
        gen = Generation(engine, "leaver", [5, 6, 7, 8], params)
        queue = gen._queue
        put, puts = queue.put_nowait, []  # every event handed to the handler
        parked: list[bool] = []  # whether the handler waited on its queue as each one came

        def put_then_leave(ev):
            # The client leaves in the same loop iteration as the row's first event arrives
            # for the handler, parked on the queue since it submitted.
            parked.append(bool(queue._getters))
            put(ev)
            puts.append(ev)
            if len(puts) == 1:
                handler.cancel()

        queue.put_nowait = put_then_leave
        handler = asyncio.ensure_future(serve_row(gen, seen))
        try:
            await handler
        except asyncio.CancelledError:
            pass
        assert parked[0]
        assert handler.cancelled(), f"the handler went on: {len(seen)} events"
        assert len(seen) < MAX_TOKENS
        # The engine answers an inbox command after the Cancel the handler sent (the loop
        # stays open meanwhile: the row's last events still have somewhere to go).
        barrier = engine.close_session("barrier")
        assert await asyncio.get_running_loop().run_in_executor(None, barrier.wait, 60)

    asyncio.run(main(engine))
    assert engine.active_rows == 0 and engine.cancellations == 1
    engine.stop()
    assert engine.join(30)
    del engine
    gc.collect()  # the cancelled task's traceback cycle holds the engine: free its MLX arrays
    # now, not in the interpreter's teardown after MLX's own statics (that aborts the process)
