"""vLLM's own V1 scheduler built and driven offline: no model, no GPU, no download, no Fairway.

The recipe mirrors vLLM's own `tests/v1/core/utils.py:create_scheduler` (which is not shipped in
the wheel and fetches a model config from the Hub): a tiny local `config.json` stands in for the
model, `skip_tokenizer_init=True` avoids the tokenizer, and a fake one-group `KVCacheConfig`
sized in blocks replaces GPU memory profiling. Nothing here executes a model: `fake_model_output`
answers a step with one sampled token per request whose prefill ended.

Why apart from `fairway.vllm.offline` (Fairway's scheduler built the same way, for the tests,
the benchmarks and the virtual-clock replay): the start-up self-test (`fairway.vllm.selftest`)
drives vLLM's own scheduler with these pieces, and Fairway's scheduler runs that self-test, so
they must not need Fairway's scheduler class.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# huggingface_hub reads this at import time; the tiny model is local, so never touch the network.
# setdefault: a caller that really wants the Hub can still say so.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402  (after HF_HUB_OFFLINE)
from vllm.config import (  # noqa: E402
    CacheConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from fairway.vllm import internals  # noqa: E402

#: Hash used for block hashes of offline requests (vLLM's default `--prefix-caching-hash-algo`).
HASH_ALGO = "sha256"

#: The tiny model: a real architecture vLLM knows, small enough to run on CPU with random weights
#: (`--load-format dummy`). head_dim 64: the CPU attention kernel rejects 16.
TINY_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

#: The context of the model the offline engine stands for (Llama-3.1-8B's 131,072 tokens): the
#: longest prompt the virtual replay accepts.
MODEL_CONTEXT_TOKENS: int = TINY_MODEL_CONFIG["max_position_embeddings"]

_hashers: dict[int, Any] = {}


def write_tiny_model_config(
    directory: str | os.PathLike[str] | None = None, *, max_position_embeddings: int | None = None
) -> str:
    """Write the tiny model's `config.json` into `directory` (default: a per-user temp dir).

    Returns the directory, usable as vLLM's `model` argument. Idempotent: an identical file is
    left alone, so concurrent test processes do not race on it.

    Args:
        directory: where to write (default: a per-user temp dir, one per positions value, so
            replays of different lengths never rewrite each other's file).
        max_position_embeddings: positions the config declares (default: the context,
            `MODEL_CONTEXT_TOKENS`). vLLM refuses a `max_model_len` above it; a prompt at the
            full context plus its output tokens needs a little more, and no model runs here.
    """
    config = dict(TINY_MODEL_CONFIG)
    if max_position_embeddings is not None:
        config["max_position_embeddings"] = int(max_position_embeddings)
    positions = config["max_position_embeddings"]
    path = Path(directory) if directory is not None else _default_model_dir(positions)
    path.mkdir(parents=True, exist_ok=True)
    target = path / "config.json"
    text = json.dumps(config, indent=2, sort_keys=True)
    if not target.exists() or target.read_text() != text:
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(target)
    return str(path)


def _default_model_dir(positions: int = MODEL_CONTEXT_TOKENS) -> Path:
    suffix = "" if positions == MODEL_CONTEXT_TOKENS else f"-{positions}"
    return Path(tempfile.gettempdir()) / f"fairway-tiny-llama-{os.getuid()}{suffix}"


def engine_configs(
    *,
    async_scheduling: bool = False,
    block_size: int = 16,
    num_blocks: int = 10_000,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 64,
    max_model_len: int = 32_768,
    enable_prefix_caching: bool = True,
    model_dir: str | None = None,
    kv_transfer_config: KVTransferConfig | Mapping[str, Any] | None = None,
    kv_events: bool = False,
    **overrides: Any,
) -> tuple[VllmConfig, KVCacheConfig]:
    """vLLM's configs of an offline engine over a fake KV cache of `num_blocks`, with the KV cache
    specs registered (the scheduler classes are built over them: `build_scheduler`).

    Args:
        async_scheduling: for the AsyncScheduler variant (output placeholders, overlap).
        block_size: tokens per KV block (also the prefix-cache hash granularity).
        num_blocks: KV cache size in blocks, including vLLM's reserved null block.
        max_num_batched_tokens / max_num_seqs / max_model_len: the usual vLLM limits.
        enable_prefix_caching: vLLM's `--enable-prefix-caching`.
        model_dir: directory with a `config.json` (default: the tiny Llama, written on demand,
            declaring at least `max_model_len` positions).
        kv_transfer_config: a `KVTransferConfig` or its dict form (P/D, e.g. NixlConnector).
        kv_events: vLLM's KV cache events on (`--kv-events-config '{"enable_kv_cache_events":
            true}'`) with its null publisher: the block pool records BlockStored / BlockRemoved
            and the scheduler hands each step's batch to its publisher (the fleet replay puts
            its own there: `fairway.vllm.fleet_signals`). False: no events config, vLLM's default.
        **overrides: any other `SchedulerConfig` or `CacheConfig` field
            (`long_prefill_token_threshold`, `policy`, `watermark`, `scheduler_reserve_full_isl`,
            ...). Unknown names raise TypeError.
    """
    sched_kw, cache_kw = _split_overrides(overrides)
    model_config = ModelConfig(
        model=model_dir or write_tiny_model_config(
            max_position_embeddings=max(max_model_len, MODEL_CONTEXT_TOKENS)
        ),
        skip_tokenizer_init=True,
        dtype="float16",
        seed=42,
        max_model_len=max_model_len,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=sched_kw.pop("enable_chunked_prefill", True),
        is_encoder_decoder=False,
        watermark=sched_kw.pop("watermark", 0.0),
        async_scheduling=async_scheduling,
        **sched_kw,
    )
    cache_config = CacheConfig(
        block_size=block_size, enable_prefix_caching=enable_prefix_caching, **cache_kw
    )
    if isinstance(kv_transfer_config, Mapping):
        kv_transfer_config = KVTransferConfig(**kv_transfer_config)
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        kv_transfer_config=kv_transfer_config,
        kv_events_config=(KVEventsConfig(enable_kv_cache_events=True, publisher="null")
                          if kv_events else None),
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    cache_config.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(vllm_config)
    return vllm_config, kv_cache_config


def build_scheduler(
    cls: type[Scheduler], vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, *,
    block_size: int, log_stats: bool, **kwargs: Any,
) -> Scheduler:
    """An instance of `cls` over `engine_configs(...)`'s configs (`kwargs`: more constructor
    arguments, e.g. Fairway's options)."""
    manager = StructuredOutputManager(vllm_config)
    return cls(
        **kwargs, vllm_config=vllm_config, kv_cache_config=kv_cache_config,
        structured_output_manager=manager, block_size=block_size, log_stats=log_stats,
    )


def make_vllm_scheduler(
    *, async_scheduling: bool = False, block_size: int = 16, log_stats: bool = True,
    **engine: Any,
) -> Scheduler:
    """vLLM's own `Scheduler` (or `AsyncScheduler`) offline: what the start-up self-test drives.
    `engine`: the other arguments of `engine_configs`."""
    vllm_config, kv_cache_config = engine_configs(
        async_scheduling=async_scheduling, block_size=block_size, **engine
    )
    cls = AsyncScheduler if async_scheduling else Scheduler
    return build_scheduler(
        cls, vllm_config, kv_cache_config, block_size=block_size, log_stats=log_stats
    )


def _split_overrides(overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    sched_fields = set(SchedulerConfig.__dataclass_fields__)
    cache_fields = set(CacheConfig.__dataclass_fields__)
    sched_kw: dict[str, Any] = {}
    cache_kw: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == "scheduling_policy":  # the CLI spelling of SchedulerConfig.policy
            sched_kw["policy"] = value
        elif key in sched_fields:
            sched_kw[key] = value
        elif key in cache_fields:
            cache_kw[key] = value
        else:
            raise TypeError(
                f"make_offline_scheduler() got an unknown keyword {key!r}; overrides must be "
                "SchedulerConfig or CacheConfig fields"
            )
    return sched_kw, cache_kw


def make_request(
    request_id: str,
    token_ids: Sequence[int],
    arrival_time: float | None = None,
    max_tokens: int = 1,
    *,
    block_size: int = 16,
    priority: int = 0,
    tenant: str | None = None,
    cache_salt: str | None = None,
    **sampling_kwargs: Any,
) -> Request:
    """A vLLM `Request` as the engine core would build it, with block hashes for prefix caching.

    Args:
        request_id: unique id.
        token_ids: the prompt.
        arrival_time: seconds on the clock Fairway orders with (default: `time.time()`).
        max_tokens: tokens to generate (1: a prefill-node request).
        block_size: must equal the scheduler's block size (hash granularity).
        priority / cache_salt: as in vLLM.
        tenant: the request's tenant, as a server gets it from ``vllm_xargs``: set as
            ``SamplingParams.extra_args["tenant"]`` (`fairway.tenants.TENANT_KEY`, merged into
            any `extra_args` given); None: no tenant (the default one).
        **sampling_kwargs: extra `SamplingParams` fields. `ignore_eos` defaults to True so that
            fake outputs never stop a request early.
    """
    sampling_kwargs.setdefault("ignore_eos", True)
    if tenant is not None:
        from fairway.tenants import TENANT_KEY

        sampling_kwargs["extra_args"] = {**(sampling_kwargs.get("extra_args") or {}),
                                         TENANT_KEY: tenant}
    params = SamplingParams(max_tokens=max_tokens, **sampling_kwargs)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
        cache_salt=cache_salt,
        block_hasher=_block_hasher(block_size),
    )


def _block_hasher(block_size: int) -> Any:
    hasher = _hashers.get(block_size)
    if hasher is None:
        hash_fn = get_hash_fn_by_name(HASH_ALGO)
        if not _hashers:
            init_none_hash(hash_fn)  # process-global seed, as EngineCore does once
        hasher = _hashers[block_size] = get_request_block_hasher(block_size, hash_fn)
    return hasher


def sampled_tokens(
    scheduler: Scheduler, scheduler_output: SchedulerOutput, token: int = 7
) -> dict[str, list[int]]:
    """One `token` for each scheduled request whose prefill is complete; [] for a chunk.

    Call it right after `schedule()`: with async scheduling a later `schedule()` changes the
    requests' chunk state before the output of the earlier step is processed.
    """
    requests = internals.requests_by_id(scheduler)
    return {
        req_id: ([] if internals.is_prefill_chunk(requests[req_id]) else [token])
        for req_id in scheduler_output.num_scheduled_tokens
    }


def fake_model_output(
    scheduler: Scheduler,
    scheduler_output: SchedulerOutput,
    token: int = 7,
    *,
    sampled: Mapping[str, list[int]] | None = None,
) -> ModelRunnerOutput:
    """The model runner's answer to `scheduler_output` without running a model.

    Args:
        scheduler / scheduler_output: the step to answer.
        token: the token "sampled" for every request that finished its prefill (or decoded).
        sampled: precomputed `sampled_tokens(...)` (needed when answering an async step late).
    """
    if sampled is None:
        sampled = sampled_tokens(scheduler, scheduler_output, token)
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return internals.model_runner_output(req_ids, [list(sampled[req_id]) for req_id in req_ids])
