"""A tiny random-weight Whisper folder that mlx-audio loads offline, and audio made in code.

The model is mlx-audio's own Whisper class at a toy width (one layer each side, 16 wide) with
Whisper's real shapes where decoding depends on them: 80 mel bins, a 1500-frame audio context
(30 s windows), and the multilingual vocabulary's layout of 51865 ids (text tokens, then
<|endoftext|>, <|startoftranscript|>, 99 languages, the task and marker tokens, then 1501
timestamps). The text tokens are the 256 byte-level characters and placeholders, in a
tokenizer.json built here, so no download is needed. Random weights give garbage text: tests
compare it with the library's own output on the same audio, never with words.
"""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000
CONFIG = {
    "model_type": "whisper",
    "n_mels": 80,
    "n_audio_ctx": 1500,
    "n_audio_state": 16,
    "n_audio_head": 2,
    "n_audio_layer": 1,
    "n_vocab": 51865,
    "n_text_ctx": 64,
    "n_text_state": 16,
    "n_text_head": 2,
    "n_text_layer": 1,
}
TEXT_TOKENS = 50257
MARKERS = ("translate", "transcribe", "startoflm", "startofprev", "nocaptions", "notimestamps")


def _tokenizer(out: Path) -> None:
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    while len(vocab) < TEXT_TOKENS:
        vocab[f"w{len(vocab)}"] = len(vocab)
    specials = [
        "<|endoftext|>",
        "<|startoftranscript|>",
        *[f"<|{code}|>" for code in list(LANGUAGES)[:99]],
        *[f"<|{m}|>" for m in MARKERS],
        *[f"<|{k * 0.02:.2f}|>" for k in range(1501)],
    ]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    assert tok.get_vocab_size() == CONFIG["n_vocab"]
    end = "<|endoftext|>"
    hf = WhisperTokenizerFast(
        tokenizer_object=tok, unk_token=end, bos_token=end, eos_token=end, pad_token=end
    )
    fe = WhisperFeatureExtractor(feature_size=CONFIG["n_mels"])
    WhisperProcessor(feature_extractor=fe, tokenizer=hf).save_pretrained(out)


def build_tiny_whisper(out: Path, seed: int = 0) -> Path:
    """Write the folder (config.json, model.safetensors, tokenizer files) and return it."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.stt.models.whisper import Model, ModelConfig

    out.mkdir(parents=True, exist_ok=True)
    _tokenizer(out)
    mx.random.seed(seed)
    model = Model(ModelConfig.from_dict(CONFIG), dtype=mx.float32)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(CONFIG))
    return out


def tone(seconds: float, hz: float = 440.0, rate: int = SAMPLE_RATE) -> np.ndarray:
    """A sine tone at 0.3 of full scale, float32 in [-1, 1]."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def wav_bytes(samples: np.ndarray, rate: int = SAMPLE_RATE, channels: int = 1) -> bytes:
    """16-bit PCM WAV of `samples` (interleaved when `channels` > 1)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 32767 / 32768) * 32768).astype("<i2").tobytes())
    return buf.getvalue()
