"""Import a GGUF file as an mlx-lm model folder (`mlxctl import-gguf`, the built-in model).

The file is read with the `gguf` package (gguf_file.py); config.json comes from transformers'
GGUF key mapping (gguf_config.py); tensors are renamed with llama.cpp's name table and converted
one at a time, K-quants dequantized and quantized again for MLX (gguf_tensors.py); the tokenizer
is rebuilt by transformers' GGUF conversion (gguf_tokenizer.py). Weights are written in shards of
at most SHARD_BYTES, so an import holds one shard and one tensor, never the whole model twice.
This module is the whole import and its command line.

    python -m mlxd.worker.importers.gguf FILE --models-dir DIR [--id NAME] [--overwrite]
        [--progress auto|bar|lines|none]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from mlxd.shared.exit_codes import EXIT_CRASH, EXIT_USAGE
from mlxd.worker.importers.gguf_file import GGUFFile, GGUFImportError
from mlxd.worker.importers.progress import MODES, Progress

SHARD_BYTES = 1 << 30

__all__ = ["GGUFImportError", "import_gguf", "main", "sanitize_id"]


def import_gguf(
    gguf_path: Path,
    models_dir: Path,
    model_id: str | None = None,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Convert a GGUF file into the mlx-lm model folder `models_dir/<id>/`.

    The id defaults to the file name, sanitized. The folder is built in a dot-prefixed temporary
    folder inside `models_dir` and renamed into place at the end, so a failed import leaves
    nothing behind. Raises GGUFImportError for anything unsupported; returns the folder.
    """
    from mlx_lm.utils import save_config

    from mlxd.worker.importers.gguf_config import build_config, generation_config
    from mlxd.worker.importers.gguf_tensors import plan_tensors
    from mlxd.worker.importers.gguf_tokenizer import write_tokenizer

    gguf_path, models_dir = Path(gguf_path), Path(models_dir)
    model_id = _check_id(model_id) if model_id else sanitize_id(gguf_path.name)
    target = models_dir / model_id
    if target.exists() and not overwrite:
        raise GGUFImportError(f"{target} already exists (pass --overwrite to replace it)")
    f = GGUFFile.open(gguf_path)
    config = build_config(f)
    plan = plan_tensors(f, config)

    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_id}.", suffix=".importing", dir=models_dir))
    try:
        write_tokenizer(f, tmp, config.get("max_position_embeddings"))  # fails fast, if at all
        quantization = _write_weights(f, plan, tmp, progress or Progress("none"))
        if quantization:
            config["quantization"] = quantization
        save_config(config, tmp / "config.json")
        gen = generation_config(f, config)
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp made it private; a model folder is not
        _swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _write_weights(f: GGUFFile, plan, folder: Path, progress: Progress) -> dict:
    import mlx.core as mx

    from mlxd.worker.importers.gguf_tensors import convert_tensor, quantization_config

    shard: dict = {}
    shard_bytes = 0
    files: list[tuple[str, list[str]]] = []  # (file name, the tensor names in it)
    bits_of: dict[str, int] = {}

    def flush() -> None:
        nonlocal shard, shard_bytes
        name = f"model-{len(files) + 1:05d}.safetensors"
        mx.save_safetensors(str(folder / name), shard, metadata={"format": "mlx"})
        files.append((name, sorted(shard)))
        shard, shard_bytes = {}, 0

    progress.start(len(plan.names), f"{f.path.name}: {len(plan.names)} tensors")
    try:
        for name, param in plan.names.items():
            out, bits = convert_tensor(f, name, plan)
            if param.endswith(".weight") and out[param].ndim == 2:
                bits_of[param.rsplit(".", 1)[0]] = bits
            shard.update(out)
            shard_bytes += sum(a.nbytes for a in out.values())
            if shard_bytes >= SHARD_BYTES:
                flush()
            progress.advance()
        if shard:
            flush()
    finally:
        progress.close()
    _name_shards(folder, files)
    return quantization_config(bits_of)


def _name_shards(folder: Path, files: list[tuple[str, list[str]]]) -> None:
    # One file keeps the plain name; several get Hugging Face's "-of-" names and an index.
    if len(files) == 1:
        (folder / files[0][0]).rename(folder / "model.safetensors")
        return
    weight_map = {}
    for i, (name, keys) in enumerate(files, 1):
        final = f"model-{i:05d}-of-{len(files):05d}.safetensors"
        (folder / name).rename(folder / final)
        weight_map.update(dict.fromkeys(keys, final))
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def sanitize_id(file_name: str) -> str:
    """A model id from a file name: lower case, `.gguf` dropped, odd characters as `-`."""
    stem = re.sub(r"\.gguf$", "", file_name, flags=re.IGNORECASE).lower()
    return re.sub(r"[^a-z0-9._-]+", "-", stem).strip(".-") or "model"


def _check_id(model_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", model_id):
        raise GGUFImportError(f"invalid model id {model_id!r}: use letters, digits, . _ -")
    return model_id


def _swap_into_place(tmp: Path, target: Path) -> None:
    old = None
    if target.exists():  # overwrite: move the old folder aside first so a rename can't fail
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        target.rename(old / target.name)
    tmp.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints the model folder as the last line of stdout, an error as one
    line on stderr (exit 2: the file or the arguments; 1: an unexpected failure)."""
    parser = argparse.ArgumentParser(
        prog="python -m mlxd.worker.importers.gguf",
        description="Import a GGUF file as an mlx-lm model folder.",
    )
    parser.add_argument("gguf", type=Path, help="the .gguf file")
    parser.add_argument("--models-dir", type=Path, required=True, help="where model folders live")
    parser.add_argument("--id", dest="model_id", help="model id (default: from the file name)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    parser.add_argument(
        "--progress", choices=MODES, default="auto", help="bar on a terminal, else lines"
    )
    args = parser.parse_args(argv)
    # transformers warns on import that PyTorch is absent; the import never needs it.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        folder = import_gguf(
            args.gguf,
            args.models_dir,
            args.model_id,
            overwrite=args.overwrite,
            progress=Progress(args.progress),
        )
    except GGUFImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_CRASH
    except Exception as exc:  # MLX or numpy failing on a damaged file: still one line
        print(f"error: import failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_CRASH
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
