#!/usr/bin/env bash
# Run the benchmark on a machine with MLX but without mlxd installed (the lent H200, see
# ../shared/gpu/README.md): expose the source tree as the `mlxd` package, put an `mlxd`
# command on PATH, then run `python -m bench run` with the given arguments.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pkg=$(mktemp -d)/src
mkdir -p "$pkg/mlxd" /tmp/mlxd-bin
cp "$root/mlxd_pkg/__init__.py" "$pkg/mlxd/__init__.py"
for d in shared supervisor worker; do ln -s "$root/$d" "$pkg/mlxd/$d"; done
printf '#!/bin/sh\nexec python3 -m mlxd.supervisor "$@"\n' > /tmp/mlxd-bin/mlxd
chmod +x /tmp/mlxd-bin/mlxd
export PYTHONPATH="$pkg:${PYTHONPATH:-}:$root" PATH="/tmp/mlxd-bin:$PATH"
cd "$root"
exec python3 -m bench run "$@"
