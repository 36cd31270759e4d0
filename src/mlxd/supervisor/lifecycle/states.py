"""Worker states and the moves allowed between them. Imports nothing on purpose."""

from enum import Enum


class State(str, Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    FATAL = "fatal"


S = State

TRANSITIONS: dict[State, frozenset[State]] = {
    S.STOPPED: frozenset({S.STARTING}),
    S.STARTING: frozenset({S.READY, S.BACKOFF, S.FATAL, S.STOPPING}),
    S.READY: frozenset({S.DRAINING, S.STOPPING, S.BACKOFF, S.FATAL}),
    S.DRAINING: frozenset({S.STOPPING, S.BACKOFF, S.FATAL}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.BACKOFF: frozenset({S.STARTING, S.STOPPED}),
    S.FATAL: frozenset({S.STOPPED}),  # only an explicit reload leaves FATAL
}

RUNNING = frozenset({S.STARTING, S.READY, S.DRAINING, S.STOPPING})  # a process exists
SERVING = frozenset({S.READY})
COLD = frozenset({S.STOPPED, S.BACKOFF})  # no process: a load may start one
ALIVE = frozenset({S.STARTING, S.READY, S.DRAINING})  # an exit now is a crash
MOVING = frozenset({S.STARTING, S.DRAINING, S.STOPPING})  # a start or a stop is under way


def is_valid_transition(src: State, dst: State) -> bool:
    return dst in TRANSITIONS[src]


class InvalidTransition(Exception):
    def __init__(self, model_id: str, src: State, dst: State):
        super().__init__(f"model={model_id}: {src.value} -> {dst.value} is not allowed")
