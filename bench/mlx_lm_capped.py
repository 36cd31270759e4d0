"""mlx_lm.server with MLX's buffer cache capped as mlxd's workers cap theirs (1/16 of the
device's memory), so two servers can share one GPU in a benchmark: uncapped, each MLX process
keeps freed buffers up to the device's whole memory and the other one runs out (an 8B model's
16k-token prefills did, on an H200). Everything else is mlx_lm.server on its defaults.

    python bench/mlx_lm_capped.py --model DIR --host 127.0.0.1 --port P
"""

import sys

# Run as a script, this folder is first on the path, and bench/profile.py would stand in
# for the standard library's `profile` (transformers imports it).
sys.path = [p for p in sys.path if p != sys.path[0]]

import mlx.core as mx  # noqa: E402

if __name__ == "__main__":
    info = mx.device_info() if mx.default_device() != mx.cpu else {}
    total = next((info[k] for k in ("total_memory", "memory_size") if info.get(k)), 0)
    if total:
        mx.set_cache_limit(total // 16)
    from mlx_lm.server import main

    sys.argv = ["mlx_lm.server", *sys.argv[1:]]
    main()
