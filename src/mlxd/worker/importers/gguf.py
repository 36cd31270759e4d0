"""Import a llama-family GGUF file as an mlx-lm model folder (`mlxctl import-gguf`).

`mx.load` reads GGUF and already maps Q4_0 / Q4_1 / Q8_0 blocks onto MLX affine quantization
(uint32 weight + float16 scales and biases, group size 32), so quantized tensors stay quantized.
The import reads the header (gguf_file.py), renames the tensors to mlx-lm's llama names,
un-permutes Q/K rows and writes config.json with per-layer quantization (gguf_llama.py), and
rebuilds tokenizer.json from the GGUF vocabulary (gguf_tokenizer.py). This module is the whole
import and its command line.

    python -m mlxd.worker.importers.gguf FILE --models-dir DIR [--id NAME] [--overwrite]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import save_config

from mlxd.shared.exit_codes import EXIT_USAGE
from mlxd.worker.importers.gguf_file import KEPT_BITS, TYPE_NAMES, GGUFImportError, read_header
from mlxd.worker.importers.gguf_llama import build_config, convert_weights, module_path
from mlxd.worker.importers.gguf_tokenizer import PRE_REGEXES, write_tokenizer

SUPPORTED_ARCHITECTURES = frozenset({"llama"})


def import_gguf(
    gguf_path: Path, models_dir: Path, model_id: str | None = None, *, overwrite: bool = False
) -> Path:
    """Convert a llama-family GGUF file into the mlx-lm model folder `models_dir/<id>/`.

    The id defaults to the file name, sanitized. The folder is built in a dot-prefixed temporary
    folder inside `models_dir` and renamed into place at the end, so a failed import leaves
    nothing behind. Raises GGUFImportError for anything unsupported; returns the folder.
    """
    gguf_path, models_dir = Path(gguf_path), Path(models_dir)
    model_id = _check_id(model_id) if model_id else sanitize_id(gguf_path.name)
    target = models_dir / model_id
    if target.exists() and not overwrite:
        raise GGUFImportError(f"{target} already exists (pass overwrite=True / --overwrite)")
    header, tensor_types = read_header(gguf_path)
    check_supported(header, tensor_types)
    arch = header["general.architecture"]
    try:
        weights, meta = mx.load(str(gguf_path), return_metadata=True)
    except Exception as exc:  # mlx raises RuntimeError / ValueError with its own text
        raise GGUFImportError(f"{gguf_path}: cannot load GGUF tensors: {exc}") from exc

    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_id}.", suffix=".importing", dir=models_dir))
    try:
        config = build_config(meta, arch)
        weights, quantization = convert_weights(weights, tensor_types, config)
        if quantization:
            config["quantization"] = quantization
        # One file: mlx-lm loads any model*.safetensors, and the GGUF was one file too.
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        save_config(config, tmp / "config.json")
        write_tokenizer(meta, tmp, config.get("max_position_embeddings"))
        tmp.chmod(0o755)  # mkdtemp made it private; a model folder is not
        _swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def sanitize_id(file_name: str) -> str:
    """A model id from a file name: lower case, `.gguf` dropped, odd characters as `-`."""
    stem = re.sub(r"\.gguf$", "", file_name, flags=re.IGNORECASE).lower()
    return re.sub(r"[^a-z0-9._-]+", "-", stem).strip(".-") or "model"


def _check_id(model_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", model_id):
        raise GGUFImportError(f"invalid model id {model_id!r}: use letters, digits, . _ -")
    return model_id


def check_supported(header: dict, tensor_types: dict[str, int]) -> None:
    """Raise GGUFImportError naming the architecture, tokenizer or tensor type not handled."""
    arch = header.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFImportError(
            f"unsupported architecture {arch!r}; "
            f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    if (tok_model := header.get("tokenizer.ggml.model")) != "gpt2":
        raise GGUFImportError(
            f"unsupported tokenizer model {tok_model!r}; supported: gpt2 (byte-level BPE)"
        )
    if (pre := header.get("tokenizer.ggml.pre", "gpt-2")) not in PRE_REGEXES:
        raise GGUFImportError(
            f"unsupported pre-tokenizer {pre!r}; supported: {', '.join(sorted(PRE_REGEXES))}"
        )
    for name, ggml_type in tensor_types.items():
        if ggml_type not in KEPT_BITS:
            kind = TYPE_NAMES.get(ggml_type, f"GGML type {ggml_type}")
            kept = ", ".join(TYPE_NAMES[t] for t in KEPT_BITS)
            raise GGUFImportError(
                f"unsupported tensor type {kind} (tensor {name}); supported: {kept}"
            )
        module_path(name)  # raises on tensors with no llama counterpart


def _swap_into_place(tmp: Path, target: Path) -> None:
    old = None
    if target.exists():  # overwrite: move the old folder aside first so a rename can't fail
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        target.rename(old / target.name)
    tmp.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints the model folder as the last line of stdout."""
    parser = argparse.ArgumentParser(
        prog="python -m mlxd.worker.importers.gguf",
        description="Import a llama-family GGUF as an mlx-lm model.",
    )
    parser.add_argument("gguf", type=Path, help="the .gguf file")
    parser.add_argument("--models-dir", type=Path, required=True, help="where model folders live")
    parser.add_argument("--id", dest="model_id", help="model id (default: from the file name)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    args = parser.parse_args(argv)
    try:
        folder = import_gguf(args.gguf, args.models_dir, args.model_id, overwrite=args.overwrite)
    except GGUFImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
