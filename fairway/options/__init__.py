"""Fairway's options: one typed, frozen object, built once at the edge and passed as an object.

`FairwayOptions` holds the ordering (`policy`), that policy's parameters (the fields of its
dataclass in `fairway.policies`, validated by the policy itself) and the serving options.
It is built in one place, `FairwayOptions.from_settings`, from `Setting`s that remember where each
value came from, so every error names the key, the value, its source and what is allowed:

* a server: defaults < `--additional-config '{"fairway": {...}}'` < `FAIRWAY_<KEY>` variables
  (`from_vllm_config`; `fairway serve` does the same check before vLLM starts, with its flags
  between the JSON and the environment);
* the replay, sweeps and benchmarks: their arguments only. They never read `FAIRWAY_*`, so a
  server's environment cannot change what a replay measures (`fairway bench` warns that it
  ignores them).

The object crosses process boundaries only as JSON in the `vllm serve` argv (`to_json`) or by
pickling (sweep workers, Ray). `--policy-arg [POLICY.]KEY=VALUE` has one grammar everywhere
(`parse_policy_args`). Must not import vllm; `fairway --help` imports this package only lazily.

The modules, lowest first (each imports only those above it in this list):

* `settings`: `Setting` (a value and its source) and `parse_value` (a value given as text);
* `fields`: the fields of the object, with their types, defaults and docs (`OptionFields`);
* `checks`: the checks of `from_settings` and their messages;
* `sources`: the `--additional-config` section and the `FAIRWAY_*` environment as settings;
* `policy_args`: the `--policy-arg` grammar;
* `help`: the help text, from the classes' source;
* `model`: `FairwayOptions`, its views and its constructors.
"""

from fairway.options.checks import allowed_values, build_policy
from fairway.options.fields import DEFAULT_POLICY, OPTION_KEYS, SERVING_OPTIONS
from fairway.options.help import attribute_docs, policy_params_help, serving_options_help
from fairway.options.model import FairwayOptions
from fairway.options.policy_args import (
    PolicyArg,
    parse_key_value,
    parse_policy_args,
    policy_arg_settings,
)
from fairway.options.settings import Setting, parse_value
from fairway.options.sources import (
    ENV_PREFIX,
    OTHER_ENV_VARS,
    SECTION,
    env_name,
    env_name_key,
    env_settings,
    is_option_name,
    json_settings,
    known_env_names,
    option_env_vars,
    unknown_env_message,
)

__all__ = [
    "DEFAULT_POLICY",
    "ENV_PREFIX",
    "OPTION_KEYS",
    "OTHER_ENV_VARS",
    "SECTION",
    "SERVING_OPTIONS",
    "FairwayOptions",
    "PolicyArg",
    "Setting",
    "allowed_values",
    "attribute_docs",
    "build_policy",
    "env_name",
    "env_name_key",
    "env_settings",
    "is_option_name",
    "json_settings",
    "known_env_names",
    "option_env_vars",
    "parse_key_value",
    "parse_policy_args",
    "parse_value",
    "policy_arg_settings",
    "policy_params_help",
    "serving_options_help",
    "unknown_env_message",
]
