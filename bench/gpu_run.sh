#!/usr/bin/env bash
# Run the benchmark on a machine with MLX but without mlxd installed (the lent H200, see
# ../shared/gpu/README.md): put src/ on the path (the `mlxd` package), an `mlxd` command on
# PATH, then run `python -m bench run` with the given arguments (or another bench command
# named first: `bash bench/gpu_run.sh group --backend nccl ...`).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p /tmp/mlxd-bin
printf '#!/bin/sh\nexec python3 -m mlxd.supervisor "$@"\n' > /tmp/mlxd-bin/mlxd
chmod +x /tmp/mlxd-bin/mlxd
export PYTHONPATH="$root/src:${PYTHONPATH:-}:$root" PATH="/tmp/mlxd-bin:$PATH"
cd "$root"
case "${1:-}" in -* | "") cmd=run ;; *) cmd=$1; shift ;; esac
exec python3 -m bench "$cmd" "$@"
