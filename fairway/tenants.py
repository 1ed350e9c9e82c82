"""Tenants: the names requests carry, the codes policies see, the weights they share a step by.

Must not import vllm. A request names its tenant in vLLM's per-request extension field,
`vllm_xargs` (`{"vllm_xargs": {"tenant": "team-a"}}` in an OpenAI completion or chat request;
`SamplingParams.extra_args["tenant"]` offline), so no client needs a patch. The operator lists the
tenants the node knows, with a weight each (option `tenants`, e.g. `{"team-a": 2, "team-b": 1}`).

Codes: 0 is the default tenant, shared by every request without a tenant *and* every request
naming a tenant the operator did not list; the listed tenants get 1, 2, ... in the order given.
Pooling the unknown names is deliberate: a tenant name is whatever the client sends, so a client
that could open a new share by inventing a name would take as many shares as it likes. The
metrics label of a request is its tenant's name, `default` without one, and `other` for an
unlisted name, so the label set is bounded by the configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fairway.errors import FairwayConfigError

#: The code and name of the tenant of requests without a (listed) tenant.
DEFAULT_TENANT = "default"
#: The metrics label of a request that names a tenant the operator did not list.
OTHER_LABEL = "other"
#: The `vllm_xargs` / `SamplingParams.extra_args` key a request names its tenant by.
TENANT_KEY = "tenant"
#: Listed tenants at most (each is a metrics label and a column of the policies' counters).
MAX_TENANTS = 64


@dataclass(frozen=True)
class TenantTable:
    """The configured tenants: name -> code and weight (code 0: the default tenant).

    Attributes:
        weights: listed tenant -> weight (> 0, finite); `default` may be listed to set the
            default tenant's weight (1 otherwise).
    """

    weights: Mapping[str, float] = field(default_factory=dict)
    _codes: dict[str, int] = field(init=False, repr=False, compare=False)
    _weights: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        codes: dict[str, int] = {DEFAULT_TENANT: 0}
        weights = [1.0]
        if len(self.weights) > MAX_TENANTS:
            raise FairwayConfigError(
                f"option tenants lists {len(self.weights)} tenants; at most {MAX_TENANTS} are "
                "allowed (each is a metrics label)"
            )
        for name, weight in self.weights.items():
            if not isinstance(name, str) or not name or name == OTHER_LABEL:
                raise FairwayConfigError(
                    f"option tenants: tenant name {name!r} is not allowed (a non-empty string "
                    f"other than {OTHER_LABEL!r})"
                )
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not math.isfinite(weight)
                or weight <= 0
            ):
                raise FairwayConfigError(
                    f"option tenants: weight of tenant {name!r} is {weight!r}; allowed: a finite "
                    "number > 0"
                )
            if name == DEFAULT_TENANT:
                weights[0] = float(weight)
                continue
            codes[name] = len(weights)
            weights.append(float(weight))
        object.__setattr__(self, "_codes", codes)
        object.__setattr__(self, "_weights", tuple(weights))

    @classmethod
    def parse(cls, value: Any) -> TenantTable:
        """The option's value: a mapping name -> weight, or a list of names (weight 1 each)."""
        if value is None:
            return cls()
        if isinstance(value, list | tuple):
            value = dict.fromkeys(value, 1.0)
        if not isinstance(value, Mapping):
            raise FairwayConfigError(
                f"option tenants is {value!r}; allowed: a JSON object of tenant name -> weight, "
                'e.g. {"team-a": 2, "team-b": 1}, or a list of names'
            )
        return cls(dict(value))

    @property
    def enabled(self) -> bool:
        """Whether any tenant besides the default one is listed (off: one tenant, today's rule)."""
        return len(self._weights) > 1

    @property
    def code_weights(self) -> tuple[float, ...]:
        """The weight of each code (index 0: the default tenant), `Step.tenant_weights`."""
        return self._weights

    @property
    def names(self) -> tuple[str, ...]:
        """The name of each code (index 0: `default`)."""
        return tuple(self._codes)

    def code_of(self, name: object) -> int:
        """The code of a request's tenant name (0 for None, a non-string or an unlisted name)."""
        if not isinstance(name, str):
            return 0
        return self._codes.get(name, 0)

    def label_of(self, name: object) -> str:
        """The metrics label: the listed name, `default` without a name, `other` if unlisted."""
        if name is None or name == "":
            return DEFAULT_TENANT
        if isinstance(name, str) and name in self._codes:
            return name
        return OTHER_LABEL

    def labels(self) -> tuple[str, ...]:
        """Every label the metrics may carry: the codes' names and `other`."""
        return (*self._codes, OTHER_LABEL)
