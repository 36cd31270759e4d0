"""Named worker exit codes. The supervisor maps load errors to FATAL instead of restarting."""

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_USAGE = 2
EXIT_MODEL_LOAD_ERROR = 3  # the model folder cannot be loaded: restarting will not help
EXIT_SOCKET_ERROR = 4  # the socket cannot be bound
EXIT_PARENT_GONE = 5  # the supervisor died; the worker followed it

NO_RESTART = frozenset({EXIT_USAGE, EXIT_MODEL_LOAD_ERROR})

# What each code means, in words a client may see (the worker's own log lines stay on /admin).
MEANING = {
    EXIT_OK: "it exited",
    EXIT_CRASH: "it crashed",
    EXIT_USAGE: "it was started wrongly",
    EXIT_MODEL_LOAD_ERROR: "the model could not be loaded",
    EXIT_SOCKET_ERROR: "its socket could not be bound",
    EXIT_PARENT_GONE: "its parent went away",
}
