"""Tenants: several classes of traffic, each with its own tenant, priority, hit rate and lengths.

A class (usually one tenant) is one spec in the family's ``tenants`` parameter, a string of
``NAME[:KEY=VALUE...]`` separated by commas, e.g.
``heavy:hits=0.9:context=6000:miss=6000,light:load=0.35:hits=0.1:miss=3000-6000``. Keys:

* ``rate`` (default 1): the class's share of the request rate among the classes without a
  ``load``; they split what the phase's load leaves, in proportion to ``rate``;
* ``load``: instead of a share, a fixed load (x capacity, same work basis as the shape) over the
  whole shape, whatever the phase (a steady tenant beside a flood); the fixed loads must fit
  under every phase's load;
* ``hits`` (default 0.9): share of the class's requests that reuse one of its hot contexts;
* ``context`` (default 6000): tokens of a hot context (a hit's prefix); ``A-B`` steps the
  contexts' lengths evenly from A to B in whole 16-token blocks;
* ``suffix`` (default 256): a hit's unique suffix (its work when the context is cached);
* ``miss`` (default 6000): tokens of a (unique) miss; ``A-B`` draws each miss uniformly in [A, B];
* ``contexts`` (default 4): hot contexts of the class (a hit picks one uniformly);
* ``priority`` (default 0): vLLM's per-request priority of the class's requests (lower first);
* ``tenant``: the tenant its requests name (default: the class name; ``none``: no tenant, the
  default tenant, for classes told apart by priority only).

Arrivals are a Poisson process per class over the load shape (`fairway.traces.shapes`): in each
phase the class's request rate makes its expected work (uncached tokens on the ``ideal`` basis,
hit-heavy's default) its share of load x capacity. Every request carries its class's tenant and
priority, its id starts with the class name (``heavy-00042``), and its tags say ``class`` and
``kind`` (hit, miss, warmup; a hit's and a warm-up's ``context``).

**Warm-up**: one request per hot context (phase ``warmup``, tag ``kind=warmup``, the class's
tenant and priority) at t = 0, `warmup_spacing_s`, ..., class by class, so the contexts are cached
before the shape's traffic (as in the `hit-heavy` family; replay with a cache that holds them,
``fairway bench --cache-fraction 1.5``). They are extra requests: the other requests are the same
without them.

Block ids carry the seed and the class name (``tn-<seed>-<class>-...``), so two traces never share
content by accident on one server, and two classes never share a context.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairway.errors import TraceError
from fairway.traces.format import TraceRequest, make_request
from fairway.traces.shapes import LoadShape, check_work_basis, poisson_arrivals

#: Granularity of the hot contexts' lengths (vLLM's default KV block, as `hit-heavy`'s).
CONTEXT_BLOCK = 16
#: What a class name (and a tenant name given with ``tenant=``) may be made of.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: ``tenant=none``: the class's requests name no tenant (the default tenant).
NO_TENANT = "none"
_KEYS = ("rate", "load", "hits", "context", "suffix", "miss", "contexts", "priority", "tenant")

#: The `tenants` preset's classes and the family's default: a heavy tenant of cache hits
#: (6k-token contexts, a 1.2k-token new turn) sending 3 x the request rate of a light tenant of
#: 1k-3k-token misses; the light tenant is a quarter of the work (0.37 x capacity in the
#: overload), under its equal share, so a fair share in uncached work can protect it.
TWO_TENANTS = (
    "heavy:rate=3:hits=0.9:context=6000:suffix=1200:miss=7200:contexts=4,"
    "light:rate=1:hits=0.1:context=2000:suffix=300:miss=1000-3000:contexts=2"
)
#: The family's default shape: calm, 150 s of overload (1.5 x capacity in uncached tokens), calm.
DEFAULT_SHAPE = "calm:0.6:60,overload:1.5:150,calm:0.6:60"


@dataclass(frozen=True)
class TenantSpec:
    """One class of traffic (see the module docstring for the keys)."""

    name: str
    rate: float = 1.0
    load: float | None = None
    hits: float = 0.9
    context: tuple[int, int] = (6000, 6000)
    suffix: int = 256
    miss: tuple[int, int] = (6000, 6000)
    contexts: int = 4
    priority: int = 0
    tenant: str | None = None

    def __post_init__(self) -> None:
        where = f"tenant spec {self.name!r}"
        if not _NAME.match(self.name):
            raise TraceError(f"{where}: a class name is letters, digits and _.- (starting with a "
                             "letter or digit)")
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise TraceError(f"{where}: rate must be > 0, got {self.rate:g}")
        if self.load is not None and not (math.isfinite(self.load) and self.load > 0):
            raise TraceError(f"{where}: load must be > 0, got {self.load:g}")
        if not 0 <= self.hits <= 1:
            raise TraceError(f"{where}: hits must be in [0, 1], got {self.hits:g}")
        for key, (low, high) in (("context", self.context), ("miss", self.miss)):
            if not 1 <= low <= high:
                raise TraceError(f"{where}: {key} must be tokens >= 1 (or a range A-B with "
                                 f"1 <= A <= B), got {low}-{high}")
        if self.suffix < 1:
            raise TraceError(f"{where}: suffix must be >= 1, got {self.suffix}")
        if self.contexts < 1:
            raise TraceError(f"{where}: contexts must be >= 1, got {self.contexts}")

    @property
    def request_tenant(self) -> str | None:
        """The tenant its requests name: `tenant`, else the class name (None for ``none``)."""
        name = self.tenant if self.tenant is not None else self.name
        return None if name == NO_TENANT else name

    def context_lengths(self) -> list[int]:
        """Tokens of each hot context: `context` A up to B in even steps of whole blocks."""
        low, high = self.context
        n = self.contexts
        if low == high or n == 1:
            return [low] * n
        step = (high - low) / (n - 1)
        inner = [low + CONTEXT_BLOCK * round(j * step / CONTEXT_BLOCK) for j in range(1, n - 1)]
        return [low, *inner, high]

    def expected_work(self, work_basis: str) -> float:
        """Expected work of one request (the first use of a context, a warm-up's, is ignored)."""
        lengths = self.context_lengths()
        hit = self.suffix + (sum(lengths) / len(lengths) if work_basis == "prompt" else 0.0)
        miss = (self.miss[0] + self.miss[1]) / 2
        return self.hits * hit + (1.0 - self.hits) * miss


def _tokens(where: str, key: str, text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        a = int(low)
        b = int(high) if sep else a
    except ValueError:
        raise TraceError(f"{where}: {key} must be tokens N or a range A-B, got {text!r}") from None
    return a, b


def parse_tenants(spec: str) -> tuple[TenantSpec, ...]:
    """The classes of a ``tenants`` parameter (module docstring); bad specs are `TraceError`s."""
    if not isinstance(spec, str) or not spec.strip():
        raise TraceError("tenants must name at least one class: NAME[:KEY=VALUE...][,...]")
    out: list[TenantSpec] = []
    for part in spec.split(","):
        name, *fields = (f.strip() for f in part.strip().split(":"))
        where = f"tenant spec {part.strip()!r}"
        values: dict[str, Any] = {}
        for item in fields:
            key, sep, value = item.partition("=")
            if not sep or key not in _KEYS:
                raise TraceError(f"{where}: {item!r} is not KEY=VALUE with KEY one of "
                                 f"{', '.join(_KEYS)}")
            if key in values:
                raise TraceError(f"{where}: {key} given twice")
            if key in ("context", "miss"):
                values[key] = _tokens(where, key, value)
            elif key == "tenant":
                if not _NAME.match(value):
                    raise TraceError(f"{where}: tenant must be a name (letters, digits, _.-) "
                                     f"or {NO_TENANT}, got {value!r}")
                values[key] = value
            else:
                number = key in ("rate", "load", "hits")
                try:
                    values[key] = float(value) if number else int(value)
                except ValueError:
                    what = "a number" if number else "an integer"
                    raise TraceError(f"{where}: {key} must be {what}, got {value!r}") from None
        out.append(TenantSpec(name, **values))
    names = [t.name for t in out]
    duplicate = sorted({n for n in names if names.count(n) > 1})
    if duplicate:
        raise TraceError(f"tenants: class names must be unique, {', '.join(duplicate)} repeats")
    return tuple(out)


@dataclass(frozen=True)
class TenantsParams:
    """Parameters of the ``tenants`` family."""

    tenants: str = TWO_TENANTS
    """The classes of traffic, NAME[:KEY=VALUE...] separated by commas; keys rate, load, hits,
    context (N or A-B), suffix, miss (N or A-B), contexts, priority, tenant (see
    fairway.traces.tenants)."""
    work_basis: str = "ideal"
    """How the request rate counts work: ideal (uncached tokens) or prompt."""
    warmup: bool = True
    """One warm-up request per hot context at t = 0, warmup_spacing_s, ... (phase warmup)."""
    warmup_spacing_s: float = 0.5
    """Seconds between two warm-up requests."""
    max_requests: int = 20000
    """Refuse to build more requests than this."""

    def __post_init__(self) -> None:
        check_work_basis(self.work_basis)
        self.classes()
        if not (math.isfinite(self.warmup_spacing_s) and self.warmup_spacing_s >= 0):
            raise TraceError(f"warmup_spacing_s must be >= 0, got {self.warmup_spacing_s}")

    def classes(self) -> tuple[TenantSpec, ...]:
        """The parsed `tenants`."""
        return parse_tenants(self.tenants)


def class_rates(shape: LoadShape, capacity_tps: float, params: TenantsParams
                ) -> dict[str, list[float]]:
    """Request rate (1/s) of each class in each phase of `shape` (module docstring)."""
    classes = params.classes()
    work = {t.name: t.expected_work(params.work_basis) for t in classes}
    fixed = sum(t.load for t in classes if t.load is not None)
    shared = [t for t in classes if t.load is None]
    shared_work = sum(t.rate * work[t.name] for t in shared)
    rates: dict[str, list[float]] = {t.name: [] for t in classes}
    for phase in shape.phases:
        left = phase.load - fixed
        if left < -1e-9 or (left > 1e-9 and not shared):
            raise TraceError(
                f"tenants: phase {phase.name} has load {phase.load:g} but the classes with a "
                f"fixed load take {fixed:g}; "
                + ("every phase's load must be at least that" if left < 0 else
                   "give a class a rate share (no load=) to take the rest")
            )
        left = max(left, 0.0)
        for t in classes:
            if t.load is not None:
                rates[t.name].append(t.load * capacity_tps / work[t.name])
            else:
                rates[t.name].append(t.rate * left * capacity_tps / shared_work)
    return rates


def build_tenants(
    family: str, seed: int, shape: LoadShape, capacity_tps: float, params: TenantsParams
) -> tuple[list[TraceRequest], dict[str, Any]]:
    """Requests of a tenants trace and the facts for the header's ``info``."""
    if not (math.isfinite(capacity_tps) and capacity_tps > 0):
        raise TraceError(f"capacity_tps must be a positive number, got {capacity_tps}")
    classes = params.classes()
    rates = class_rates(shape, capacity_tps, params)
    warmup = _warmup_requests(seed, params, classes)
    shaped: list[TraceRequest] = []
    for k, spec in enumerate(classes):
        times = poisson_arrivals(shape, rates[spec.name], np.random.default_rng([seed, 1, k]))
        if len(shaped) + len(times) + len(warmup) > params.max_requests:
            raise TraceError(
                f"{family}: the shape needs more than max_requests={params.max_requests} "
                "requests; lower the load or raise max_requests"
            )
        shaped.extend(_class_requests(seed, spec, shape, times,
                                      np.random.default_rng([seed, 2, k])))
    # Merge by arrival (stable: warm-ups first, then the classes in the order given).
    reqs = sorted([*warmup, *shaped], key=lambda r: r.arrival_s)
    info = {
        "work_basis": params.work_basis,
        "classes": {
            t.name: {
                "tenant": t.request_tenant, "priority": t.priority,
                "work_per_request_tokens": round(t.expected_work(params.work_basis), 3),
                "rate_per_phase": [round(r, 6) for r in rates[t.name]],
                "context_lengths": t.context_lengths() if t.hits > 0 else [],
            }
            for t in classes
        },
        "warmup": [{"request_id": r.request_id, "arrival_s": r.arrival_s} for r in warmup],
    }
    return reqs, info


def _context_block(seed: int, spec: TenantSpec, j: int, tokens: int) -> tuple[str, int]:
    """Hot context j of a class (the length is in the id: one id, one token count)."""
    return f"tn-{seed}-{spec.name}-ctx-{j}-{tokens}", tokens


def _class_requests(seed: int, spec: TenantSpec, shape: LoadShape, times: np.ndarray,
                    rng: np.random.Generator) -> list[TraceRequest]:
    """The shape's requests of one class, arriving at `times`."""
    lengths = spec.context_lengths()
    draws = rng.random((len(times), 3))
    low, high = spec.miss
    out: list[TraceRequest] = []
    for i, t in enumerate(times):
        t = round(float(t), 6)
        if draws[i, 0] < 1.0 - spec.hits:
            tokens = low + min(int(draws[i, 1] * (high - low + 1)), high - low)
            blocks = [(f"tn-{seed}-{spec.name}-miss-{i}", tokens)]
            tags: dict[str, Any] = {"class": spec.name, "kind": "miss"}
        else:
            j = min(int(draws[i, 2] * spec.contexts), spec.contexts - 1)
            blocks = [_context_block(seed, spec, j, lengths[j]),
                      (f"tn-{seed}-{spec.name}-suffix-{i}", spec.suffix)]
            tags = {"class": spec.name, "kind": "hit", "context": j}
        out.append(make_request(f"{spec.name}-{i:05d}", t, blocks, phase=shape.phase_at(t),
                                tags=tags, tenant=spec.request_tenant, priority=spec.priority))
    return out


def _warmup_requests(seed: int, params: TenantsParams,
                     classes: tuple[TenantSpec, ...]) -> list[TraceRequest]:
    """One request per hot context of every class with hits, `warmup_spacing_s` apart."""
    if not params.warmup:
        return []
    out: list[TraceRequest] = []
    for spec in classes:
        if spec.hits <= 0:
            continue
        for j, tokens in enumerate(spec.context_lengths()):
            blocks = [_context_block(seed, spec, j, tokens),
                      (f"tn-{seed}-{spec.name}-warmup-{j}", spec.suffix)]
            out.append(make_request(
                f"{spec.name}-warmup-{j:02d}", len(out) * params.warmup_spacing_s, blocks,
                phase="warmup", tags={"class": spec.name, "kind": "warmup", "context": j},
                tenant=spec.request_tenant, priority=spec.priority,
            ))
    return out
