"""transformers' import table from disk (worker/import_cache.py): fresh interpreters, the real
transformers and mlx-lm, the tiny model's tokenizer; what a worker start reads must be what
transformers would have built, and a damaged file must cost nothing but the build."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Installs the finder, imports what a worker imports, and reports: the tokenizer's ids for a
# text, and whether every table served equals transformers' own build of it.
PROBE = """
import json, sys
from pathlib import Path
from mlxd.worker import import_cache
import_cache.install(Path(sys.argv[1]))
from mlx_lm.tokenizer_utils import load as load_tokenizer
import transformers.utils.import_utils as iu
ids = load_tokenizer(Path(sys.argv[2])).encode("The harbor town kept its lighthouse lit.")
build = iu.define_import_structure.__wrapped__.__wrapped__  # transformers' own, uncached
saved = [json.loads(f.read_text()) for f in sorted(Path(sys.argv[1]).glob("*.json"))]
same = [import_cache.from_json(s["table"]) == build(s["module_path"], s["prefix"]) for s in saved]
import transformers
print(json.dumps({"ids": ids, "same": same, "probe": "MlxdProbeName" in dir(transformers)}))
"""


def probe(folder, model) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(folder), str(model)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_second_start_reads_the_table_and_tokenizes_the_same(tmp_path, tiny_model_dir):
    first = probe(tmp_path, tiny_model_dir)
    files = sorted(tmp_path.glob("transformers-imports-*.json"))
    assert files and first["same"] == [True] * len(files) and not first["probe"]
    # A name planted in the saved top-level table shows up: the next start reads the file.
    for f in files:
        saved = json.loads(f.read_text())
        if saved["prefix"] == "models":
            saved["table"][0][1].append(["zz_probe", ["MlxdProbeName"]])
            f.write_text(json.dumps(saved))
    second = probe(tmp_path, tiny_model_dir)
    assert second["probe"] and second["ids"] == first["ids"]


def test_a_damaged_table_is_built_again_and_replaced(tmp_path, tiny_model_dir):
    good = probe(tmp_path, tiny_model_dir)
    files = sorted(tmp_path.glob("transformers-imports-*.json"))
    for f in files:
        f.write_text('[[["torch"], [["x.y", ')  # a write cut short
    assert probe(tmp_path, tiny_model_dir) == good
    for f in files:
        json.loads(f.read_text())  # whole again
    assert not list(tmp_path.glob("*.tmp"))
