"""`python -m mlxd.worker --spec JSON`, or `--model-path DIR --model-id ID --socket PATH`.

The worker's entry point: the one place in the worker that reads or sets the environment.
"""

import logging
import os
import sys

# First: it reads the parent this worker started under, before the slow imports below.
from mlxd.shared.lifeline import die_with_parent

# Never reach for the hub from a worker: model folders are local by contract. Set before
# mlx_lm (and huggingface_hub, which reads it once on import) is imported below.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Our own children (grammar compiles) inherit unbuffered output, as the worker has it (-u).
os.environ.setdefault("PYTHONUNBUFFERED", "1")
from mlxd.worker.device_env import apply_device_env  # noqa: E402

apply_device_env(os.environ)  # before MLX's first kernel: it reads them once
from mlxd.worker.cpu_blas import load_cpu_blas  # noqa: E402

load_cpu_blas(os.environ)  # before mlx.core is imported: MLX binds to it then
from mlxd.worker import import_cache  # noqa: E402

import_cache.install()  # before mlx-lm imports transformers: its import table from disk

from mlxd.worker.config import parse_args  # noqa: E402
from mlxd.worker.dist.env import forget_hostfile, group_env, write_hostfile  # noqa: E402

if __name__ == "__main__":
    cfg = parse_args(log_level=os.environ.get("MLXD_LOG_LEVEL", "INFO"))
    if cfg.group is not None:  # where mx.distributed finds its peers (mlx.launch's variables)
        try:
            os.environ.update(group_env(cfg.group, write_hostfile(cfg.group), os.environ))
        except ValueError as exc:  # a rank without a GPU of its own: say why, no traceback
            sys.exit(f"mlxd worker: {exc}")
    # MLX starts with this import: after the rank's GPU is chosen (CUDA reads it once).
    from mlxd.worker.app import main

    if cfg.exit_with_parent:
        die_with_parent()
    code = main(cfg)
    forget_hostfile()  # a rank that ended before it joined (an embedding model's rank 0, ...)
    # Everything is flushed and stopped by now. Skip the interpreter's teardown: MLX's C++
    # statics (per-thread streams of helper threads) can abort the process while they are
    # destroyed, turning a clean exit into SIGABRT.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
