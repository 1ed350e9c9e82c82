"""Where a server's options come from: the `"fairway"` section of `--additional-config` (JSON)
and the `FAIRWAY_<KEY>` environment variables, each read as `Setting`s.

The replay, sweeps and benchmarks never read the environment (`FairwayOptions.for_replay`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from fairway.errors import FairwayConfigError
from fairway.options.checks import param_owners
from fairway.options.fields import OPTION_KEYS
from fairway.options.settings import Setting, parse_value

#: The key of Fairway's section in vLLM's `--additional-config`.
SECTION = "fairway"
#: Prefix of the server's environment overrides: FAIRWAY_POLICY, FAIRWAY_FAST_WEIGHT, ...
ENV_PREFIX = "FAIRWAY_"
#: `FAIRWAY_*` variables that are not options: allowed beside a server, never read as options.
#: A new one must be added here, or servers started with it set refuse to start. (Test settings
#: do not start with FAIRWAY_: TEST_FAIRWAY_SHARE_EXAMPLES, TEST_FAIRWAY_E2E_*.)
OTHER_ENV_VARS: dict[str, str] = {
    "FAIRWAY_DATA": "the data directory of `fairway trace build` / `fairway data`",
    "FAIRWAY_SOURCE_DATA": "the raw data the tests rebuild the shipped traces from",
    "FAIRWAY_TARGET": "the engine `make setup` installs (cpu or gpu)",
    "FAIRWAY_COMPAT_REPORT": "the report file of `make compat`",
    # a secret: never read as an option, so never logged with them (`fairway.trust.SEAL_ENV`)
    "FAIRWAY_SEAL_KEY": "the secret a server's middleware seals trusted tenants with",
}
_JSON_SOURCE = "--additional-config"


# --- --additional-config '{"fairway": {...}}' -----------------------------------------------------


def json_settings(section: Any, source: str = _JSON_SOURCE) -> list[Setting]:
    """The `"fairway"` section of `--additional-config` as settings."""
    if section is None:
        return []
    if not isinstance(section, Mapping):
        raise FairwayConfigError(
            f"{source} {SECTION!r} must be a JSON object, got {section!r}; "
            f'e.g. --additional-config \'{{"fairway": {{"policy": "fairway"}}}}\''
        )
    return [Setting(str(k), v, f"{source} {SECTION}.{k}") for k, v in section.items()]


# --- FAIRWAY_<KEY> --------------------------------------------------------------------------------


def env_name(key: str) -> str:
    """The environment variable that overrides option `key`."""
    return ENV_PREFIX + key.upper()


def env_name_key(name: str) -> str:
    """The option key of a `FAIRWAY_<KEY>` name."""
    return name[len(ENV_PREFIX):].lower()


def known_env_names() -> dict[str, str]:
    """`FAIRWAY_<KEY>` of every option and every policy's parameter -> what it sets."""
    names = {env_name(k): "serving option" for k in OPTION_KEYS}
    for param, owners in param_owners().items():
        names.setdefault(env_name(param), f"parameter of {', '.join(owners)}")
    return names


def env_settings(environ: Mapping[str, str]) -> list[Setting]:
    """The `FAIRWAY_*` variables of a server's environment as settings.

    Variables in `OTHER_ENV_VARS` are skipped. Any other `FAIRWAY_*` name that is neither an
    option nor a parameter of some policy is an error listing the known names (a typo such as
    FAIRWAY_FASTWEIGHT must not be ignored); a parameter of another policy than the chosen one
    is rejected by `FairwayOptions.from_settings`, as the same key in the JSON would be.
    """
    known = known_env_names()
    out = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or not is_option_name(name):
            continue
        if name not in known:
            raise FairwayConfigError(unknown_env_message(name, environ[name], known))
        out.append(Setting(env_name_key(name), parse_value(environ[name]), name))
    return out


def unknown_env_message(name: str, value: str, known: Mapping[str, str]) -> str:
    """The error for a `FAIRWAY_*` variable that is no option."""
    close = difflib.get_close_matches(name, [*known, *OTHER_ENV_VARS], n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (
        f"unknown Fairway variable {name}={value!r} in the environment; {hint}Fairway options: "
        f"{', '.join(env_name(k) for k in OPTION_KEYS)}; policy parameters: "
        f"{', '.join(sorted(k for k in known if env_name_key(k) not in OPTION_KEYS))}; "
        f"other FAIRWAY_ variables: {', '.join(OTHER_ENV_VARS)}"
    )


def is_option_name(name: str) -> bool:
    """Whether a `FAIRWAY_*` name is meant as an option (known or not), not another setting."""
    return name not in OTHER_ENV_VARS


def option_env_vars(environ: Mapping[str, str]) -> list[str]:
    """The `FAIRWAY_*` names in `environ` that a server would read as options (sorted)."""
    return sorted(n for n in environ if n.startswith(ENV_PREFIX) and is_option_name(n))
