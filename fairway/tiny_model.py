"""A tiny random-weight Llama with a real byte-level tokenizer, built offline for tests and demos.

`vllm serve DIR` loads it like any Hugging Face checkpoint (weights, tokenizer, chat template), so
end-to-end tests exercise the real serving path (tokenizer included) on CPU without a download.
The weights are random: the output is noise, but prefill cost and prefix caching are real.
Deterministic given the arguments: the same seed writes byte-identical weights and tokenizer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Special tokens at the start of the vocabulary, Llama's convention (unk 0, bos 1, eos 2).
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
#: vLLM's CPU attention kernel accepts head_dim 64 (16 fails), so heads are 64 wide.
HEAD_DIM = 64
#: Room for the 3 special tokens and the 256 byte tokens, plus at least one merge.
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256 + 1
DTYPES = ("bfloat16", "float16", "float32")

#: Letters whose pairs become the BPE merges (most frequent English letters first), so that
#: ordinary text tokenizes into fewer tokens than bytes; the order fixes the token ids.
_MERGE_ALPHABET = " etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ0123456789.,"

#: A minimal chat template (no system-prompt logic): enough for /v1/chat/completions to work.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
#: The merges are the pairs of `_MERGE_ALPHABET`, so the vocabulary cannot grow beyond this.
MAX_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256 + len(_MERGE_ALPHABET) ** 2


def make_tiny_model(
    path: str | os.PathLike[str],
    *,
    vocab_size: int = 512,
    hidden: int = 256,
    layers: int = 2,
    max_len: int = 4096,
    seed: int = 0,
    dtype: str = "bfloat16",
) -> Path:
    """Write a random-weight `LlamaForCausalLM` and its tokenizer into `path`; return the path.

    Args:
        path: output directory (created; existing files of the same names are overwritten).
        vocab_size: model and tokenizer vocabulary, in [260, 4484] (3 specials, 256 bytes, then
            merges of frequent character pairs).
        hidden: hidden size, a positive multiple of 64 (heads are 64 wide: hidden / 64 heads).
        layers: number of decoder layers (>= 1).
        max_len: `max_position_embeddings` and the tokenizer's `model_max_length` (>= 16).
        seed: torch seed for the weights.
        dtype: storage dtype of the safetensors weights.

    Raises:
        ValueError: an argument is out of range (the message says what is allowed).
    """
    _check_args(vocab_size=vocab_size, hidden=hidden, layers=layers, max_len=max_len, dtype=dtype)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _write_weights(out, vocab_size, hidden, layers, max_len, seed, dtype)
    write_tokenizer(out, vocab_size=vocab_size, max_len=max_len)
    return out


def _check_args(*, vocab_size: int, hidden: int, layers: int, max_len: int, dtype: str) -> None:
    """Reject arguments that would produce a model vLLM cannot serve on CPU."""
    _check_vocab_size(vocab_size)
    if hidden <= 0 or hidden % HEAD_DIM:
        raise ValueError(f"hidden must be a positive multiple of {HEAD_DIM}, got {hidden}")
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    if max_len < 16:
        raise ValueError(f"max_len must be >= 16, got {max_len}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def _check_vocab_size(vocab_size: int) -> None:
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size must be in [{MIN_VOCAB_SIZE}, {MAX_VOCAB_SIZE}], got {vocab_size}"
        )


def _write_weights(
    out: Path, vocab_size: int, hidden: int, layers: int, max_len: int, seed: int, dtype: str
) -> None:
    """Random Llama weights as safetensors, plus `config.json` and `generation_config.json`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    num_heads = hidden // HEAD_DIM
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=max_len,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=None,
        tie_word_embeddings=False,
        dtype=dtype,
    )
    # Seeded CPU initialisation is deterministic; the generator is restored afterwards so callers'
    # own random streams are not disturbed.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out)


def write_tokenizer(
    path: str | os.PathLike[str], *, vocab_size: int = 512, max_len: int = 4096
) -> Path:
    """Write a byte-level BPE tokenizer with `vocab_size` tokens into `path`, built locally.

    Files: `tokenizer.json`, `tokenizer_config.json` (with a chat template) and
    `special_tokens_map.json`. Every byte string is encodable (256 byte tokens) and every id
    decodes (the vocabulary fills the model's whole embedding table, so random sampling never
    produces an unknown id). Also usable on its own as a stand-in tokenizer for offline tests.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    _check_vocab_size(vocab_size)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = _byte_level_vocab(vocab_size)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", _tokenizer_config(max_len))
    _write_json(
        out / "special_tokens_map.json",
        {
            "unk_token": SPECIAL_TOKENS[UNK_ID],
            "bos_token": SPECIAL_TOKENS[BOS_ID],
            "eos_token": SPECIAL_TOKENS[EOS_ID],
        },
    )
    return out


def _tokenizer_config(max_len: int) -> dict[str, Any]:
    """`tokenizer_config.json`: a fast tokenizer with Llama's special tokens and a chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "unk_token": SPECIAL_TOKENS[UNK_ID],
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for i, t in enumerate(SPECIAL_TOKENS)
        },
        "chat_template": CHAT_TEMPLATE,
    }


def _byte_level_vocab(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary (specials, 256 byte symbols in byte order, then merges) and the merge list."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    symbol = bytes_to_symbols()
    for byte in range(256):
        vocab[symbol[byte]] = len(vocab)
    merges: list[tuple[str, str]] = []
    for left, right in _merge_pairs(symbol):
        if len(vocab) >= vocab_size:
            break
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    return vocab, merges


def _merge_pairs(symbol: dict[int, str]) -> Iterator[tuple[str, str]]:
    """Pairs of frequent single characters, in a fixed order (the order of `_MERGE_ALPHABET`)."""
    letters = [symbol[ord(c)] for c in _MERGE_ALPHABET]
    for left in letters:
        for right in letters:
            yield left, right


def bytes_to_symbols() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the alphabet of the ByteLevel pre-tokenizer).

    Printable Latin-1 bytes stand for themselves; the others are shifted to code points from 256
    on, in byte order. This must match `tokenizers`' ByteLevel mapping, which it is the definition
    of (checked in the unit tests by round-tripping every byte).
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    shifted = 0
    for byte in range(256):
        if byte not in symbols:
            symbols[byte] = chr(256 + shifted)
            shifted += 1
    return symbols


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
