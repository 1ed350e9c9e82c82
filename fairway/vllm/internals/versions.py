"""What changed between the supported vLLM releases, read once from vLLM's class declarations.

Each field of `VllmShape` is one known release's meaning, never a guess from a missing attribute:
the functions that branch on it name the releases of each branch, and the start-up self-test
(`fairway.vllm.selftest`, run by `tests/integration/test_selftest.py` on 0.32, 0.33 and 0.34)
drives the branch the running vLLM takes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class VllmShape:
    """How the running vLLM spells what changed between the supported releases, read once from
    its class declarations (never guessed from a missing attribute: each branch is a known
    release's meaning, and the start-up self-test exercises the one taken)."""

    #: `CachedRequestData.resumed_req_ids` lists resumed requests apart from the new ones (0.32,
    #: 0.33); 0.34 sends them in `scheduled_new_reqs`.
    resumed_apart: bool
    #: `ModelRunnerOutput` takes `req_id_to_index` (0.32, 0.33; removed in 0.34).
    runner_output_index: bool
    #: `BlockHashToBlockMap` entries are block ids into the pool's blocks (0.34); before, a block
    #: or a dict of duplicate blocks.
    map_holds_ids: bool
    #: `Request.prefix_cache_hit_limit` bounds what a request may read from the caches (0.34);
    #: before, the flag `Request.skip_reading_prefix_cache`.
    hit_limit: bool
    #: `EngineCoreOutput.error` carries a request error's text (0.33, 0.34); 0.32 has no field.
    output_error: bool
    #: `KVCacheCoordinator.drop_eagle_group_ids` names the groups whose last hit block is dropped
    #: (0.33, 0.34); 0.32 reads `eagle_group_ids`.
    drop_eagle: bool


@functools.cache
def shape() -> VllmShape:
    """The running vLLM's `VllmShape`."""
    import inspect

    from vllm.v1.core.block_pool import BlockHashToBlockMap
    from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator
    from vllm.v1.core.sched.output import CachedRequestData
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.outputs import ModelRunnerOutput

    return VllmShape(
        resumed_apart="resumed_req_ids" in CachedRequestData.__dataclass_fields__,
        runner_output_index="req_id_to_index" in ModelRunnerOutput.__dataclass_fields__,
        map_holds_ids="blocks" in inspect.signature(BlockHashToBlockMap.__init__).parameters,
        hit_limit="prefix_cache_hit_limit" in _request_attrs(),
        output_error="error" in EngineCoreOutput.__struct_fields__,
        # attribute names assigned in __init__ (self.x = ...)
        drop_eagle="drop_eagle_group_ids" in KVCacheCoordinator.__init__.__code__.co_names,
    )


def _request_attrs() -> set[str]:
    """Attribute names a Request has (properties on the class, fields set in __init__)."""
    from vllm.v1.request import Request

    names = set(dir(Request))
    init = Request.__init__.__code__
    names.update(init.co_names)  # attribute names assigned in __init__ (self.x = ...)
    return names
