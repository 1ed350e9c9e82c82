"""PEEK-proxy: rank by the prefill time the cached prefix saves. Must not import vllm.

Ordering half only; eviction protection lives in the vLLM integration (`fairway/vllm/protect.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from fairway.errors import ProfileError
from fairway.policies.base import Policy, register_policy
from fairway.policies.queue import QueuedRequest
from fairway.profiling.table import PrefillProfile, default_profile, load


@register_policy("peek")
@dataclass(eq=False)
class PEEKPolicy(Policy):
    """PEEK-proxy: saved prefill time T(L) − T(c), largest first.

    Formula: saved_r = T(L_r) − T(c_r), where T is the profile's idle prefill time
    (`PrefillProfile.prefill_s`), L = `prompt_tokens` and c = `remaining` (uncached tokens, >= 1).
    T(c) is the time of a c-token prompt alone; it leaves out the attention of the c new tokens over
    the h cached ones, so `saved` slightly overstates the saving of long hits (a 1-D table has
    nothing better). With h = 0, saved = 0.

    Source: no paper or code of PEEK could be found, so this is a proxy of its description ("ranks
    by the prefill its cache saves") and must be labelled "PEEK-proxy", not PEEK. The described
    system also protects the cache blocks that waiting requests need from eviction (as vLLM RFC
    #48485 proposes); that half is not an ordering and lives in the vLLM integration
    (`fairway/vllm/protect.py`), not here.

    Tie-breaks: equal saving by arrival, then queue position.

    Args:
        profile: the T(L) table: a `PrefillProfile`, a path or shipped table name (loaded with
            `fairway.profiling.table.load`), or None (default) for the shipped
            `default_profile()`. After construction the field holds the loaded `PrefillProfile`.

    Caller's contract: no state; `on_step_end` is a no-op. Use the profile of the GPU and model
    being served, as for Fairway.
    """

    needs_cache_hits: ClassVar[bool] = True

    #: T(L) table, path or shipped name; None: the shipped default.
    profile: PrefillProfile | str | None = None

    def __post_init__(self) -> None:
        """Validate the parameters (ValueError naming the parameter and its allowed range)."""
        value = self.profile
        if value is None:
            self.profile = default_profile()
        elif isinstance(value, str):
            try:
                self.profile = load(value)
            except ProfileError as exc:
                raise ValueError(f"profile={value!r} cannot be loaded: {exc}") from None
        elif not isinstance(value, PrefillProfile):
            raise ValueError(
                "profile must be a PrefillProfile, a profile path or shipped name, or None; "
                f"got {type(value).__name__}"
            )

    def order(self, queue: Sequence[QueuedRequest], now: float) -> list[int]:
        """Return indices by (−(T(L) − T(c)), arrival)."""
        prefill_s = self.profile.prefill_s  # type: ignore[union-attr]  # set in __post_init__
        saved = [prefill_s(r.prompt_tokens) - prefill_s(r.remaining) for r in queue]
        return sorted(range(len(queue)), key=lambda i: (-saved[i], queue[i].arrival))
