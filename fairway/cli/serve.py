"""`fairway serve`: vLLM's server with Fairway's scheduler, its options checked before vLLM starts.

A thin wrapper: it builds Fairway's options the way the server will (`fairway.options`: the
`--additional-config` section, then its flags, then `FAIRWAY_*`), so a typo fails in a second, not
after model loading; then it runs `vllm serve` with the scheduler class, the FCFS queue (or the
priority queue, when `--scheduling-policy priority` is given), prefix caching,
`--additional-config '{"fairway": {...}}'` and, when option `tenant_source` is api-key or header,
Fairway's tenant middleware (`fairway.middleware`). Every other argument goes to vLLM
untouched. The command is built by a pure function (`plan_serve`) that the unit tests call
without vLLM. Module level imports stay light: `fairway --help` must not load vLLM. The checks of
the engine flags live in `fairway.vllm_argv`, which runs them on a plain `vllm serve` line too.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairway.cli import HelpFormatter
from fairway.errors import FairwayConfigError
from fairway.vllm_argv import (
    FAIRWAY_SCHEDULER_CLASSES,
    SCHEDULER_CLS,
    bool_flag,
    check_vllm_cli,
    flag_value,
    queue_flags,
    remove_flag,
    run_server,
    user_additional_config,
    vllm_launcher,
)

if TYPE_CHECKING:  # imported where used: `fairway --help` stays quick
    from fairway.options import FairwayOptions, Setting

#: Environment variable that routes `fairway:` metrics to the API server's /metrics (see
#: `fairway.vllm.metrics`); duplicated here so building the command imports no prometheus_client.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: What `--dry-run` prints for the metrics directory `fairway serve` would create at start.
_NEW_TEMP_DIR = "$(mktemp -d)"


def register(subparsers: Any) -> None:
    """Add the `serve` subcommand to the `fairway` parser."""
    serve = subparsers.add_parser(
        "serve",
        help="run `vllm serve` with Fairway's scheduler",
        description="Run `vllm serve MODEL` with --scheduler-cls FairwayScheduler (it follows "
        "vLLM's async-scheduling setting), --scheduling-policy fcfs (unless "
        "--scheduling-policy priority is given: vLLM's per-request priority levels, lower first, "
        "each ordered by the policy; no other value is accepted), "
        "--enable-prefix-caching, Fairway's options in --additional-config and, with "
        "tenant_source api-key or header, --middleware fairway.middleware.TenantMiddleware. "
        "Fairway's options "
        "are checked before vLLM starts. Any other argument is passed to vLLM unchanged "
        "(see `vllm serve --help`). FAIRWAY_<KEY> environment variables override every option; "
        "an unknown FAIRWAY_ variable is an error.",
        formatter_class=HelpFormatter,
        epilog=_options_help,
    )
    serve.add_argument("model", metavar="MODEL", help="model path or name, as for `vllm serve`")
    _add_fairway_flags(serve)
    serve.add_argument(
        "vllm_args",
        nargs=argparse.REMAINDER,
        metavar="VLLM_ARGS",
        help="any other `vllm serve` argument, passed through unchanged",
    )
    serve.set_defaults(handler=_serve)


def _options_help() -> str:
    from fairway.options.help import policy_params_help, serving_options_help

    return f"{serving_options_help()}\n\n{policy_params_help()}"


def _add_fairway_flags(parser: argparse.ArgumentParser) -> None:
    """Fairway's own `serve` flags (also parsed again from the arguments after MODEL)."""
    parser.add_argument(
        "--policy",
        default=None,
        metavar="NAME",
        help="ordering of the waiting queue (default: fairway; the policies are listed below)",
    )
    parser.add_argument(
        "--policy-arg",
        action="append",
        default=[],
        metavar="[POLICY.]KEY=VALUE",
        help="a parameter of the policy (repeatable), e.g. fast_weight=4; see below",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PATH_OR_NAME",
        help="prefill-time table from `fairway profile` (or a shipped table's "
        "name); sets each request's patience",
    )
    parser.add_argument(
        "--fairway-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a serving option (repeatable), e.g. protect=true; see below",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the command and environment, do not start vLLM",
    )


def split_serve_args(args: argparse.Namespace) -> argparse.Namespace:
    """Take Fairway's flags out of the arguments after MODEL (`vllm_args`).

    argparse hands everything after MODEL to `vllm_args`, so `fairway serve M --policy lpm
    --port 8000` would send `--policy` to vLLM; this second pass moves Fairway's flags back into
    the namespace (later values win, lists extend) and leaves the rest for vLLM, in order.
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _add_fairway_flags(parser)
    ours, rest = parser.parse_known_args(list(args.vllm_args))
    merged = argparse.Namespace(**vars(args))
    merged.vllm_args = rest
    merged.policy = ours.policy if ours.policy is not None else args.policy
    merged.profile = ours.profile if ours.profile is not None else args.profile
    merged.policy_arg = [*args.policy_arg, *ours.policy_arg]
    merged.fairway_option = [*args.fairway_option, *ours.fairway_option]
    merged.dry_run = bool(args.dry_run or ours.dry_run)
    return merged


# --- fairway serve: the command (pure) ------------------------------------------------------------


@dataclass(frozen=True)
class ServePlan:
    """What `fairway serve` will run.

    Attributes:
        argv: the vLLM command line.
        env: the complete environment for it.
        env_changes: the variables Fairway added or changed in `env` (shown by --dry-run).
        fairway_config: the `"fairway"` section sent in `--additional-config`.
        options: the `FairwayOptions` the scheduler will resolve (environment included).
        warnings: messages for the user (no profile, environment overriding a flag, ...).
    """

    argv: list[str]
    env: dict[str, str]
    env_changes: dict[str, str]
    fairway_config: dict[str, Any]
    options: FairwayOptions
    warnings: list[str] = field(default_factory=list)


def plan_serve(
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    launcher: Sequence[str] | None = None,
) -> ServePlan:
    """Build Fairway's options and the vLLM command (no side effects, no vLLM import).

    Args:
        args: the parsed `serve` namespace (`split_serve_args` is applied here).
        environ: the environment the server will inherit (default: os.environ); FAIRWAY_* in it
            take part exactly as they will in the scheduler.
        launcher: the program that runs `vllm` (default: `vllm_launcher()`).

    Raises:
        FairwayConfigError: a Fairway option, a conflicting vLLM flag or bad JSON; the message
            names the flag and what is allowed.
    """
    from fairway.middleware import serve_flags
    from fairway.options import FairwayOptions, env_settings

    args = split_serve_args(args)
    environ = dict(os.environ if environ is None else environ)
    vllm_args = list(args.vllm_args)
    _reject_dotted_additional_config(vllm_args)
    additional = user_additional_config(vllm_args)
    given = _given_settings(args, additional.get("fairway"))
    options = FairwayOptions.from_settings([*given, *env_settings(environ)])
    options.check_server()
    section = FairwayOptions.from_settings(given).to_json()
    flagged = sorted({s.key for s in given if not s.source.startswith("--additional-config")})
    warnings = [
        f"{options.sources[key]} in the environment overrides the value given on the command "
        f"line for {key!r}"
        for key in flagged
        if options.sources[key].startswith("FAIRWAY_")
    ]
    engine_flags = [
        *_scheduler_flags(vllm_args), *queue_flags(vllm_args, options),
        *serve_flags(vllm_args, options),
    ]
    additional = {**additional, "fairway": section}
    argv = [
        *(vllm_launcher() if launcher is None else launcher),
        "serve",
        args.model,
        *engine_flags,
        "--additional-config",
        json.dumps(additional, sort_keys=True),
        *remove_flag(vllm_args, "additional-config"),
    ]
    warnings += _profile_warning(options)
    env, changes = _server_env(environ)
    return ServePlan(argv, env, changes, section, options, warnings)


def _given_settings(args: argparse.Namespace, section: Any) -> list[Setting]:
    """The user's JSON section, then the flags (flags win), as `Setting`s."""
    import fairway.policies as policies
    from fairway.options import (
        DEFAULT_POLICY,
        SERVING_OPTIONS,
        FairwayOptions,
        Setting,
        json_settings,
        parse_key_value,
        parse_policy_args,
        policy_arg_settings,
    )

    given = json_settings(section)
    if args.policy is not None:
        given.append(Setting("policy", args.policy, "--policy"))
    policy = next((s.value for s in reversed(given) if s.key == "policy"), DEFAULT_POLICY)
    if policy not in policies.names():
        FairwayOptions.from_settings(given)  # raises: the policy, its source, the known ones
    given += policy_arg_settings(parse_policy_args(args.policy_arg), [policy])[policy]
    for item in args.fairway_option:
        key, value = parse_key_value(item, "--fairway-option")
        _check_json_value(key, item)
        if key not in SERVING_OPTIONS:
            raise FairwayConfigError(
                f"--fairway-option {key}=...: unknown option; options: "
                f"{', '.join(SERVING_OPTIONS)} (policy parameters go in --policy-arg, the policy "
                "in --policy)"
            )
        given.append(Setting(key, value, f"--fairway-option {key}"))
    if args.profile is not None:
        if "profile" not in policies.param_names(policy):
            takers = [n for n in policies.names() if "profile" in policies.param_names(n)]
            raise FairwayConfigError(
                f"--profile: policy {policy!r} takes no prefill-time profile (policies that do: "
                f"{', '.join(takers)})"
            )
        given.append(Setting("profile", _profile_ref(args.profile), "--profile"))
    return given


def _check_json_value(key: str, item: str) -> None:
    """A `--fairway-option KEY=VALUE` whose VALUE opens a JSON list or object must be valid JSON.

    `parse_value` keeps text that does not parse as JSON, so `tenants=[a,b]` (the shell ate the
    quotes) would otherwise reach the option's check as the string '[a,b]'.
    """
    raw = item.partition("=")[2].strip()
    if not raw.startswith(("[", "{")):
        return
    try:
        json.loads(raw)
    except ValueError as exc:
        raise FairwayConfigError(
            f"--fairway-option {key}={raw}: not valid JSON ({exc}); give a JSON list or object "
            f"in single quotes, e.g. --fairway-option {key}='[\"heavy\", \"light\"]' or "
            f"{key}='{{\"heavy\": 2, \"light\": 1}}'"
        ) from None


def _profile_ref(value: str) -> str:
    """An existing file becomes an absolute path (the server may run elsewhere); a name stays."""
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


def _profile_warning(options: FairwayOptions) -> list[str]:
    """The no-profile warning: without a table, every request gets the same patience."""
    import fairway.policies as policies

    if "profile" not in policies.param_names(options.policy) or options.policy_params.get(
        "profile"
    ):
        return []
    floor = options.policy_params.get("patience_floor_s", 1.0)
    return [
        f"no --profile: policy {options.policy!r} falls back to the patience floor "
        f"(patience_floor_s={floor} s) for every request, whatever its length. Measure this GPU "
        "and model once with `fairway profile` and pass --profile PATH (shipped estimate: "
        "--profile a6000-llama3.1-8b-estimate)."
    ]


def _scheduler_flags(vllm_args: list[str]) -> list[str]:
    """Fairway's scheduler class (it follows vLLM's async setting); a user's own must be ours."""
    user_cls = flag_value(vllm_args, "scheduler-cls")
    if user_cls is None:
        return ["--scheduler-cls", SCHEDULER_CLS]
    if user_cls not in FAIRWAY_SCHEDULER_CLASSES:
        raise FairwayConfigError(
            f"--scheduler-cls {user_cls}: `fairway serve` runs Fairway's scheduler "
            f"({SCHEDULER_CLS}); use `vllm serve` for another class"
        )
    if FAIRWAY_SCHEDULER_CLASSES[user_cls] and not bool_flag(vllm_args, "async-scheduling"):
        raise FairwayConfigError(
            f"--scheduler-cls {user_cls} needs --async-scheduling: use {SCHEDULER_CLS} (it "
            "follows vLLM's async-scheduling setting), or leave --scheduler-cls out"
        )
    return []  # the user's flag stays in vllm_args


def _server_env(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The server's environment: a fresh Prometheus multiprocess directory unless one is set.

    The directory is what carries `fairway:` metrics from the EngineCore process to /metrics
    (`fairway.vllm.metrics`); `run_serve` creates it at start and removes it at exit. Here it is
    the placeholder `$(mktemp -d)`, which is also what --dry-run prints.
    """
    env = dict(environ)
    changes: dict[str, str] = {}
    if not env.get(MULTIPROC_ENV):
        env[MULTIPROC_ENV] = changes[MULTIPROC_ENV] = _NEW_TEMP_DIR
    return env, changes


def _reject_dotted_additional_config(vllm_args: Sequence[str]) -> None:
    for arg in vllm_args:
        if arg.startswith(("--additional-config.", "--additional_config.")):
            raise FairwayConfigError(
                f"{arg.split('=')[0]}: give --additional-config as one JSON object (fairway serve "
                'merges its "fairway" section with Fairway\'s flags)'
            )


# --- fairway serve: the handler -------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    args = split_serve_args(args)
    plan = plan_serve(args)
    for message in plan.warnings:
        print(f"fairway: warning: {message}", file=sys.stderr)
    if args.dry_run:
        print(format_command(plan.argv, plan.env_changes))
        return 0
    return run_serve(plan)


def format_command(argv: Sequence[str], env_changes: Mapping[str, str]) -> str:
    """A shell line: the environment changes, then the command (`$(mktemp -d)` left unquoted)."""
    env = [
        f"{k}={v if v == _NEW_TEMP_DIR else shlex.quote(v)}" for k, v in sorted(env_changes.items())
    ]
    return " ".join([*env, shlex.join(argv)])


def run_serve(plan: ServePlan) -> int:
    """Create the metrics directory, run the server, remove the directory; the exit code."""
    import shutil

    from fairway.vllm.metrics import prepare_server_env

    check_vllm_cli()
    env = dict(plan.env)
    created = env.get(MULTIPROC_ENV) == _NEW_TEMP_DIR
    if created:
        del env[MULTIPROC_ENV]
    env = prepare_server_env(env)
    changes = {k: env[k] for k in plan.env_changes}
    print(f"fairway: starting vLLM: {format_command(plan.argv, changes)}", file=sys.stderr)
    try:
        return run_server(plan.argv, env)
    finally:
        if created:
            shutil.rmtree(env[MULTIPROC_ENV], ignore_errors=True)
