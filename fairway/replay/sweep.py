"""Many replays at once: local worker processes (default) or Ray tasks on a cluster (`--ray`).

A sweep is a list of jobs: `ReplayJob`s (trace x policy x settings, one `sim.replay` each) or any
other `Job` (the fleet replay's `fairway.fleet.bench.FleetJob`: trace x router x policy). Each
job runs in a worker process, never a thread: the scheduler loop is pure Python and holds the
GIL, and a process keeps vLLM's global state (hash seed, loggers) away from the caller. Workers
are spawned, not forked (forking a process that imported torch is unsafe), and are reused across
jobs by default because importing vLLM costs 5-15 s of CPU per process, more than a replay of a
six-minute trace; `fresh_processes=True` gives every replay a new process instead. Each job builds
its own scheduler and policy, so reuse does not carry state from one replay to the next, and the
results come back in job order whatever the completion order: the same jobs give the same
results with any number of workers.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from fairway.errors import FairwayConfigError, FairwayError
from fairway.replay.results import ReplayResult

if TYPE_CHECKING:
    from fairway.options import FairwayOptions
    from fairway.traces.format import Trace

logger = logging.getLogger(__name__)

#: Environment of every worker process: quiet vLLM (start-up banners and CPU-platform hints per
#: replay otherwise; policy failures are counted in each result's settings and reported by the
#: bench), and one thread per worker (the replay computes nothing in torch).
WORKER_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
RAY_INSTALL_HINT = "pip install 'vllm-fairway[ray]'"
#: Local worker processes of a sweep (`fairway bench --workers`, the benchmark scripts).
DEFAULT_WORKERS = 2


R_co = TypeVar("R_co", covariant=True)
R = TypeVar("R")


class Job(Protocol[R_co]):
    """What a sweep runs: a frozen dataclass (pickled to its worker; on Ray its `trace` travels
    apart, through the object store) that checks itself and runs in the worker."""

    @property
    def trace_name(self) -> str:
        """The trace's label in results."""
        ...

    @property
    def trace(self) -> Trace:
        """The workload."""
        ...

    @property
    def key(self) -> tuple[str, str]:
        """Unique within a sweep: (trace name, the run's label)."""
        ...

    def describe(self) -> str:
        """`trace @ label` for messages."""
        ...

    def check(self) -> None:
        """Raise a `FairwayError` for bad names or parameters, before any work starts."""
        ...

    def run(self) -> R_co:
        """The job's replay, here (what a worker process or a Ray task executes)."""
        ...


@dataclass(frozen=True)
class ReplayJob:
    """One replay of a sweep.

    Attributes:
        trace_name: label of the trace in results and reports.
        trace: the workload (sent to the worker by pickling; traces are a few MB at most).
        policy: registry name, or the run's `FairwayOptions` (built once from the flags;
            pickled to the worker as it is).
        policy_params: the policy's parameters (more, when `policy` is a name).
        options: other keyword arguments of `fairway.replay.sim.replay` (profile, cache_fraction,
            num_blocks, max_num_batched_tokens, open_loop, ...).
        label: policy label in results when one policy appears with several parameter sets
            (e.g. `fairway[fast_weight=2]`); None: the policy name.
    """

    trace_name: str
    trace: Trace
    policy: str | FairwayOptions
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    label: str | None = None

    @property
    def policy_name(self) -> str:
        """The policy's registry name."""
        return self.policy if isinstance(self.policy, str) else self.policy.policy

    @property
    def key(self) -> tuple[str, str]:
        """(trace name, policy label): unique within a sweep."""
        return self.trace_name, self.label or self.policy_name

    def describe(self) -> str:
        """`trace @ policy` for messages."""
        return f"{self.trace_name} @ {self.label or self.policy_name}"

    def check(self) -> None:
        """The policy's name and parameters are valid."""
        from fairway.options import FairwayOptions

        FairwayOptions.for_replay(self.policy, self.policy_params)

    def run(self) -> ReplayResult:
        """`sim.replay` of this job, its result labelled."""
        from fairway.replay.sim import replay

        result = replay(
            self.trace, self.policy, policy_params=dict(self.policy_params),
            trace_name=self.trace_name, **dict(self.options),
        )
        if self.label is not None:
            result.policy = self.label
        return result


class SweepError(FairwayError):
    """A replay of the sweep failed; the message names the trace and policy."""


def run_job(job: Job[R]) -> R:
    """Run one job here (what a worker process or a Ray task executes)."""
    return job.run()


def run_job_in_worker(job: Job[R]) -> R:
    """`run_job` in a worker process or Ray task, whose error must cross back by pickling.

    vLLM's config errors are pydantic `ValidationError`s, which cannot be pickled: sent back as
    they are, the user would see `TypeError: cannot pickle ...` instead of vLLM's message. So an
    error leaves the worker as a `SweepError` carrying the replay's name and the message (a
    `FairwayError` that pickles leaves as it is). The chained original is not pickled; the
    pool's remote traceback text still shows it.
    """
    try:
        return run_job(job)
    except FairwayError as exc:
        if _pickles(exc):
            raise
        raise SweepError(f"replay {job.describe()} failed: {exc}") from exc
    except Exception as exc:
        raise SweepError(f"replay {job.describe()} failed: {describe_error(exc)}") from exc


def describe_error(exc: BaseException) -> str:
    """`TypeName: message`, the message as the exception gives it (vLLM's own wording)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _pickles(exc: BaseException) -> bool:
    """Whether `exc` survives the trip back from a worker (pickled, then rebuilt)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return False
    return True


def _init_worker() -> None:
    """Initializer of each spawned worker (before vLLM is imported there).

    No logging set-up: Python's last-resort handler still prints fairway's warnings to stderr.
    """
    os.environ.update(WORKER_ENV)


def check_jobs(jobs: Sequence[Job[Any]]) -> None:
    """Reject duplicate (trace, label) pairs and bad jobs before any work starts."""
    seen: set[tuple[str, str]] = set()
    for job in jobs:
        if job.key in seen:
            raise FairwayConfigError(
                f"{job.describe()} is in the sweep twice; give a distinct label to each "
                "parameter set of one policy"
            )
        seen.add(job.key)
        job.check()  # validates names and parameters


def run_jobs(
    jobs: Sequence[Job[R]],
    *,
    workers: int = DEFAULT_WORKERS,
    ray_address: str | None = None,
    fresh_processes: bool = False,
    progress: bool = True,
    on_result: Callable[[R], object] | None = None,
) -> list[R]:
    """Run every job and return the results in job order.

    Args:
        jobs: the replays.
        workers: local worker processes; 0 runs the jobs one by one in this process.
        ray_address: run the jobs as Ray tasks instead: "local" starts a Ray instance here
            (`ray.init()`), anything else is a cluster address (`ray://host:10001`, `auto`).
        fresh_processes: a new local process for every replay (slower: vLLM import per job).
        progress: a tqdm bar over finished replays.
        on_result: called in this process with each result as it arrives (e.g. to save it, so
            that an interrupted sweep keeps what it finished).

    Raises:
        SweepError: a replay raised (the first one; the rest are cancelled).
        FairwayConfigError: bad jobs, bad `workers`, or Ray requested but not installed.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise FairwayConfigError(f"workers must be an integer >= 0, got {workers!r}")
    check_jobs(jobs)
    if not jobs:
        return []
    if ray_address is not None:
        return _run_ray(jobs, ray_address, progress, on_result)
    if workers == 0:
        return _run_here(jobs, progress, on_result)
    return _run_pool(jobs, workers, fresh_processes, progress, on_result)


def _bar(total: int, progress: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, disable=not progress, unit="replay", desc="replays",
                dynamic_ncols=True)


def _run_here(jobs: Sequence[Job[R]], progress: bool,
              on_result: Callable[[R], object] | None) -> list[R]:
    results = []
    with _bar(len(jobs), progress) as bar:
        for job in jobs:
            try:
                result = run_job(job)
            except FairwayError:
                raise
            except Exception as exc:
                raise SweepError(f"replay {job.describe()} failed: {describe_error(exc)}"
                                 ) from exc
            results.append(result)
            if on_result is not None:
                on_result(result)
            bar.set_postfix_str(job.describe(), refresh=False)
            bar.update()
    return results


def _run_pool(jobs: Sequence[Job[R]], workers: int, fresh: bool, progress: bool,
              on_result: Callable[[R], object] | None) -> list[R]:
    context = multiprocessing.get_context("spawn")
    results: list[R | None] = [None] * len(jobs)
    pool = cf.ProcessPoolExecutor(
        max_workers=min(workers, len(jobs)), mp_context=context, initializer=_init_worker,
        max_tasks_per_child=1 if fresh else None,
    )
    try:
        # Longest traces first: a long replay started last would leave the other workers idle.
        order = sorted(range(len(jobs)), key=lambda i: -len(jobs[i].trace))
        futures = {pool.submit(run_job_in_worker, jobs[i]): i for i in order}
        with _bar(len(jobs), progress) as bar:
            for future in cf.as_completed(futures):
                i = futures[future]
                try:
                    result = future.result()
                except FairwayError:
                    raise
                except Exception as exc:  # the pool's own (a worker died: BrokenProcessPool)
                    raise SweepError(f"replay {jobs[i].describe()} failed: "
                                     f"{describe_error(exc)}") from exc
                results[i] = result
                if on_result is not None:
                    on_result(result)
                bar.set_postfix_str(jobs[i].describe(), refresh=False)
                bar.update()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [r for r in results if r is not None]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FairwayConfigError(
            f"--ray needs Ray, which is not installed; install it with: {RAY_INSTALL_HINT}"
        ) from None
    return ray


def _run_ray(jobs: Sequence[Job[R]], address: str, progress: bool,
             on_result: Callable[[R], object] | None) -> list[R]:
    """One Ray task per job; each distinct trace is put in the object store once."""
    ray = _import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        env = {"env_vars": dict(WORKER_ENV)}
        if address == "local":
            ray.init(runtime_env=env, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, runtime_env=env, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(_ray_task)
        trace_refs: dict[int, Any] = {}
        refs = []
        for job in jobs:
            key = id(job.trace)
            if key not in trace_refs:
                trace_refs[key] = ray.put(job.trace)
            # The job travels without its trace (None, for this hop only): the trace goes once
            # through the object store, and `_ray_task` puts it back.
            traceless = replace(job, trace=None)  # type: ignore[type-var]
            refs.append(task.remote(traceless, trace_refs[key]))
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[R | None] = [None] * len(jobs)
        pending = list(refs)
        with _bar(len(jobs), progress) as bar:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                i = index[done[0]]
                try:
                    result = ray.get(done[0])
                except Exception as exc:
                    for ref in pending:
                        ray.cancel(ref)
                    raise SweepError(f"replay {jobs[i].describe()} failed on Ray: {exc}") from exc
                results[i] = result
                if on_result is not None:
                    on_result(result)
                bar.update()
        return [r for r in results if r is not None]
    finally:
        if started_here:
            ray.shutdown()


def _ray_task(job: Job[R], trace: Trace) -> R:
    """A Ray task: the job with its trace from the object store."""
    return run_job_in_worker(replace(job, trace=trace))  # type: ignore[type-var]
