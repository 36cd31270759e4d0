"""`python -m mlxd.worker --model-path DIR --model-id ID --socket PATH`."""

import logging
import os
import sys

from mlxd.worker.app import main
from mlxd.worker.config import parse_args
from mlxd.worker.lifeline import die_with_parent

if __name__ == "__main__":
    cfg = parse_args()
    if cfg.exit_with_parent:
        die_with_parent()
    code = main(cfg)
    # Everything is flushed and stopped by now. Skip the interpreter's teardown: MLX's C++
    # statics (per-thread streams of helper threads) can abort the process while they are
    # destroyed, turning a clean exit into SIGABRT.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
