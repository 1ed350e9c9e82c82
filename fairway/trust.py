"""Who a request's tenant is, and how urgent it may be: the trust model of a Fairway server.

Must not import vllm (the ASGI middleware, `fairway.middleware`, imports it in vLLM's API-server
process, the scheduler's gate, `fairway.vllm.identity`, in the EngineCore).

The problem. A request names its tenant in `vllm_xargs` and its urgency in vLLM's `priority`
field; both are written by the client. With tenants listed, any client could name a listed tenant
and take its share of the prefill, and under `--scheduling-policy priority` any client could send
a priority below everyone else's. Identity is known where the caller is authenticated: vLLM's API
server (the API key) or a gateway in front of it. Option `tenant_source` says which one the node
trusts:

* `client`: the client's `vllm_xargs.tenant` is the tenant, and its `priority` is kept (above
  `priority_floor` when that is set). Every client is trusted; what Fairway did before the option.
* `api-key`: Fairway's middleware (`--middleware fairway.middleware.TenantMiddleware`) maps the
  caller's API key (`Authorization: Bearer KEY`) to a tenant and a priority floor, from the JSON
  map named by option `tenant_keys`.
* `header`: the middleware reads the identity from a header that a gateway sets (option
  `tenant_header`, default `x-fairway-tenant`): `NAME` or `NAME; priority_floor=N`. The gateway
  must overwrite the header on every request (a client that reaches the node directly, or
  through a gateway that passes the header on, can send any identity).

How the identity reaches the scheduler, unforgeably. The API server and the scheduler are
different processes and vLLM carries only the request's fields between them, so the middleware
writes the identity into the body's `vllm_xargs` under keys of its own, `fairway_tenant` and
`fairway_priority_floor`, with `fairway_seal` = HMAC-SHA256 over both under a secret shared by
the node's processes (`FAIRWAY_SEAL_KEY`; `ensure_seal_secret` draws one before vLLM starts its
engine processes, which inherit it). The scheduler (`TrustRule.judge`) believes those keys only
with a valid seal. So an identity cannot be forged by a client that writes the keys itself (it
does not know the secret), nor by any route into the engine that the middleware does not see
(another endpoint, a server started without the middleware): such requests carry no valid seal
and get the default tenant and the floor. The middleware also deletes the three keys from what
the client sent. The client's own `vllm_xargs.tenant` is left in the body: the scheduler reads it
only to count and log the claim it ignores.

What the secret does not protect: anyone who reads the engine's request logs (vLLM's
`--enable-log-requests` prints `extra_args`) sees the seal of an identity and could replay it;
a fresh secret is drawn at every start unless the operator sets `FAIRWAY_SEAL_KEY`.

Priority. vLLM orders `--scheduling-policy priority` levels lower first, and preempts by them.
The floor is the lowest (most urgent) priority a request may have: a lower one is raised to it
(counted and logged like an ignored tenant). The floor of a request is its sealed
`fairway_priority_floor` (from its key's entry or the gateway's header), else option
`priority_floor`, else 0 (vLLM's default priority) when trust is enforced (`api-key`, `header`)
and none under `client`. A client may always ask for less urgency (a higher number).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fairway.errors import FairwayConfigError
from fairway.tenants import TENANT_KEY

TenantSource = Literal["client", "api-key", "header"]
#: The values of option `tenant_source`.
TENANT_SOURCES: tuple[TenantSource, ...] = ("client", "api-key", "header")
#: The sources whose identities only the middleware can give (trust enforced).
ENFORCED_SOURCES = ("api-key", "header")
#: The environment variable holding the secret the middleware seals identities with.
SEAL_ENV = "FAIRWAY_SEAL_KEY"
#: Shortest secret accepted (hex digits of 128 bits).
MIN_SECRET_CHARS = 32
#: `vllm_xargs` keys only the middleware writes (deleted from what a client sends).
TRUSTED_TENANT_KEY = "fairway_tenant"
TRUSTED_FLOOR_KEY = "fairway_priority_floor"
SEAL_KEY = "fairway_seal"
RESERVED_KEYS = (TRUSTED_TENANT_KEY, TRUSTED_FLOOR_KEY, SEAL_KEY)
#: The header a gateway names the tenant in under `tenant_source: header` (option tenant_header).
DEFAULT_HEADER = "x-fairway-tenant"
#: The floor under enforced trust when option `priority_floor` is null: vLLM's default priority.
ENFORCED_FLOOR = 0
#: `tenant_keys: env:NAME` reads the key map from environment variable NAME.
ENV_SPEC_PREFIX = "env:"
_SEAL_CONTEXT = b"fairway-identity-v1"


@dataclass(frozen=True, slots=True)
class Identity:
    """What a trusted source says about a caller.

    Attributes:
        tenant: the tenant's name (None: the default tenant).
        priority_floor: the lowest priority its requests may have (None: the node's floor).
    """

    tenant: str | None = None
    priority_floor: int | None = None


# --- the seal ------------------------------------------------------------------------------------


#: Valid seals a `Sealer` remembers (a caller sends the same identity, so the same seal, with
#: every request); forgotten all at once when full. Invalid seals are never remembered.
_KNOWN_SEALS = 4096


class Sealer:
    """HMAC-SHA256 of an identity under the node's secret (`SEAL_ENV`)."""

    def __init__(self, secret: str) -> None:
        if len(secret) < MIN_SECRET_CHARS:
            raise FairwayConfigError(
                f"{SEAL_ENV} holds {len(secret)} characters; at least {MIN_SECRET_CHARS} are "
                "needed (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
            )
        self._key = secret.encode()
        self._known: set[tuple[str | None, int | None, str]] = set()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Sealer:
        """The sealer of this node's processes (raises if the secret is missing)."""
        secret = (os.environ if environ is None else environ).get(SEAL_ENV, "")
        if not secret:
            raise FairwayConfigError(
                f"tenant_source api-key or header needs the secret {SEAL_ENV} in the environment "
                "of every vLLM process of the node (Fairway's plugin draws one when `vllm serve` "
                "starts; set it yourself for engines started apart, e.g. --headless, to the "
                "same value as the API server's)"
            )
        return cls(secret)

    def seal(self, identity: Identity) -> str:
        """The seal of `identity` (hex)."""
        return hmac.new(self._key, _message(identity), hashlib.sha256).hexdigest()

    def verify(self, identity: Identity, seal: object) -> bool:
        """Whether `seal` is `identity`'s (constant time; a seal found valid before is
        remembered: an HMAC costs ~5 us, a burst of 1,000 requests 5 ms).
        """
        if not isinstance(seal, str):
            return False
        key = (identity.tenant, identity.priority_floor, seal)
        if key in self._known:
            return True
        if not hmac.compare_digest(self.seal(identity), seal):
            return False
        if len(self._known) >= _KNOWN_SEALS:
            self._known.clear()
        self._known.add(key)
        return True


def _message(identity: Identity) -> bytes:
    # the tenant's length keeps the fields apart whatever its name holds; "-": no tenant
    tenant = "-" if identity.tenant is None else "+" + identity.tenant
    return b"%s%d:%s%r" % (_SEAL_CONTEXT, len(tenant), tenant.encode(), identity.priority_floor)


def ensure_seal_secret(environ: MutableMapping[str, str]) -> bool:
    """Draw the node's secret into `environ` unless one is set; returns whether it drew one.

    Called before vLLM starts its engine processes, which inherit the environment."""
    if environ.get(SEAL_ENV):
        return False
    environ[SEAL_ENV] = secrets.token_hex(32)
    return True


# --- the middleware's side: sources of identity, and the body's edit ----------------------------


def parse_identity(value: object, where: str) -> Identity:
    """An entry of the key map: a tenant name, or `{"tenant": NAME, "priority_floor": N}` (both
    optional)."""
    if isinstance(value, str) and value:
        return Identity(value)
    if isinstance(value, Mapping) and set(value) <= {"tenant", "priority_floor"}:
        tenant, floor = value.get("tenant"), value.get("priority_floor")
        if (tenant is None or isinstance(tenant, str) and tenant) and _is_int(floor, True):
            return Identity(tenant, floor)
    raise FairwayConfigError(
        f"{where}: {value!r} is not an identity; allowed: a tenant name, or an object "
        '{"tenant": NAME, "priority_floor": INTEGER} (both keys optional)'
    )


def _is_int(value: object, none_ok: bool = False) -> bool:
    return (value is None and none_ok) or isinstance(value, int) and not isinstance(value, bool)


class KeyMap:
    """API key -> `Identity`, from option `tenant_keys`. Keys are kept as SHA-256 digests."""

    def __init__(self, entries: Mapping[str, Identity]) -> None:
        self._by_digest = {_digest(key): identity for key, identity in entries.items()}

    def __len__(self) -> int:
        return len(self._by_digest)

    @classmethod
    def load(cls, spec: str, environ: Mapping[str, str] | None = None) -> KeyMap:
        """The map option `tenant_keys` names: a JSON file, or `env:NAME` for the JSON in
        environment variable NAME; a JSON object of API key -> identity (`parse_identity`)."""
        environ = os.environ if environ is None else environ
        if spec.startswith(ENV_SPEC_PREFIX):
            name = spec[len(ENV_SPEC_PREFIX):]
            where = f"option tenant_keys={spec!r} (environment variable {name})"
            if name not in environ:
                raise FairwayConfigError(f"{where}: the variable is not set")
            text = environ[name]
        else:
            where = f"option tenant_keys={spec!r}"
            try:
                text = Path(spec).read_text(encoding="utf-8")
            except OSError as exc:
                raise FairwayConfigError(f"{where}: cannot read the file: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise FairwayConfigError(f"{where}: not JSON: {exc}") from None
        if not isinstance(data, Mapping) or not data:
            raise FairwayConfigError(
                f"{where}: expected a non-empty JSON object of API key -> tenant, e.g. "
                '{"sk-team-a": "team-a", "sk-ops": {"tenant": "ops", "priority_floor": -5}}'
            )
        entries = {}
        for key, value in data.items():
            if not key:
                raise FairwayConfigError(f"{where}: an API key is empty")
            entries[key] = parse_identity(value, f"{where}, key {_masked(key)}")
        return cls(entries)

    def identity_of(self, api_key: str) -> Identity | None:
        """The identity of a caller's key (None: an unknown key)."""
        return self._by_digest.get(_digest(api_key))


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _masked(key: str) -> str:
    """A key as it may appear in a message: its first 4 characters."""
    return repr(key[:4] + "...")


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header (None: absent or another scheme)."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def parse_header(value: str | None) -> Identity | None:
    """The identity a gateway's header gives: `NAME` or `NAME; priority_floor=N` (None: absent
    or malformed, i.e. no trusted identity)."""
    if value is None:
        return None
    name, *params = (part.strip() for part in value.split(";"))
    floor: int | None = None
    for param in params:
        key, sep, number = param.partition("=")
        if key.strip() != "priority_floor" or not sep:
            return None
        try:
            floor = int(number.strip())
        except ValueError:
            return None
    return Identity(name or None, floor)


def stamp(
    xargs: Mapping[str, Any] | None, identity: Identity | None, sealer: Sealer
) -> dict[str, Any]:
    """The middleware's edit of a body's `vllm_xargs` (None: the body has none): the reserved
    keys the client sent are deleted; with an `identity`, its sealed keys are written. Other
    keys (the client's own `tenant` included) are kept."""
    out = {k: v for k, v in (xargs or {}).items() if k not in RESERVED_KEYS}
    if identity is not None:
        if identity.tenant is not None:
            out[TRUSTED_TENANT_KEY] = identity.tenant
        if identity.priority_floor is not None:
            out[TRUSTED_FLOOR_KEY] = identity.priority_floor
        out[SEAL_KEY] = sealer.seal(identity)
    return out


# --- the scheduler's side -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the scheduler makes of one request.

    Attributes:
        tenant: the tenant it is served as (None: the default tenant).
        claimed: a tenant the client named that is ignored (None: none ignored).
        priority: the priority it is served at.
        raised: whether `priority` was raised to the floor.
    """

    tenant: str | None
    claimed: str | None
    priority: int
    raised: bool


@dataclass(frozen=True)
class TrustRule:
    """How the scheduler judges a request's tenant and priority (`judge`).

    Attributes:
        source: option `tenant_source` (`client`, `api-key`, `header`).
        floor: the floor without a sealed one (None: no floor).
        sealer: checks the seals (None under `client`: nothing is sealed).
    """

    source: TenantSource
    floor: int | None
    sealer: Sealer | None

    @classmethod
    def build(
        cls, source: TenantSource, priority_floor: int | None,
        environ: Mapping[str, str] | None = None,
    ) -> TrustRule:
        """The rule of the options (`api-key` and `header` need the secret in `environ`)."""
        enforced = source in ENFORCED_SOURCES
        floor = ENFORCED_FLOOR if enforced and priority_floor is None else priority_floor
        return cls(source, floor, Sealer.from_env(environ) if enforced else None)

    @property
    def enforced(self) -> bool:
        """Whether only sealed identities are believed."""
        return self.sealer is not None

    @property
    def acts(self) -> bool:
        """Whether judging can change a request (else the scheduler need not look)."""
        return self.enforced or self.floor is not None

    def judge(self, xargs: Mapping[str, Any] | None, priority: int) -> Verdict:
        """The tenant and priority a request with `vllm_xargs` / `extra_args` and `priority`
        is served as."""
        xargs = xargs if isinstance(xargs, Mapping) else {}
        claimed = xargs.get(TENANT_KEY)
        floor = self.floor
        if self.sealer is None:
            tenant, ignored = claimed, None
        else:
            sealed, sealed_floor = xargs.get(TRUSTED_TENANT_KEY), xargs.get(TRUSTED_FLOOR_KEY)
            identity = Identity(sealed, sealed_floor)
            trusted = (
                SEAL_KEY in xargs
                and (sealed is None or isinstance(sealed, str))
                and _is_int(sealed_floor, none_ok=True)
                and self.sealer.verify(identity, xargs[SEAL_KEY])
            )
            tenant = identity.tenant if trusted else None
            if trusted and sealed_floor is not None:
                floor = sealed_floor
            named = claimed is not None and claimed != ""
            ignored = claimed if named and claimed != tenant else None
        if floor is not None and priority < floor:
            return Verdict(tenant, ignored, floor, True)
        return Verdict(tenant, ignored, priority, False)
