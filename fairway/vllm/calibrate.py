"""Self-calibration in the scheduler (option `self_calibrate`, off by default): the vLLM side.

Also the step log (option `step_log`): the same step times and chunks, one JSON line per step,
so a step-time model can be checked against the live engine offline.

Times each engine step, reads its chunks from vLLM's `SchedulerOutput` (`internals.step_chunks`),
feeds `fairway.profiling.calibration.StepTimeCalibrator` (the engine-agnostic fit, cost model in
its docstring) and hands each snapshot table to the policy and the
`fairway:calibrated_prefill_seconds` gauge. Imports no vLLM module (it reads vLLM objects), so
logging goes through the `fairway` logger, to which the plugin attaches vLLM's handlers.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from fairway.profiling.calibration import StepTimeCalibrator
from fairway.profiling.table import PrefillProfile
from fairway.vllm import internals

logger = logging.getLogger(__name__)

#: Lengths of the published `fairway:calibrated_prefill_seconds` series (those <= max_model_len).
GAUGE_LENGTHS = (512, 2048, 8192, 32768)


_gauge: Any = None


def _calibrated_gauge() -> Any:
    """The process-wide `fairway:calibrated_prefill_seconds` gauge (created on first use)."""
    global _gauge
    if _gauge is None:
        from prometheus_client import Gauge

        _gauge = Gauge(
            "fairway:calibrated_prefill_seconds",
            "Self-calibrated idle prefill time T(L) of a prompt of prompt_tokens tokens, from "
            "the engine's own step times (option self_calibrate).",
            ("model_name", "engine", "policy", "prompt_tokens"),
            multiprocess_mode="mostrecent",
        )
    return _gauge


class StepLog:
    """Appends one JSON line per timed engine step: {"t", "s", "chunks": [[new, before], ...]}.

    `t` is the wall-clock time the step's output arrived, `s` its measured seconds (see
    `SchedulerCalibration`), `chunks` what `internals.step_chunks` reads from vLLM's output.
    Line-buffered, so a killed server loses at most the line being written.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - long-lived

    def write(self, chunks: list[tuple[int, int]], step_seconds: float) -> None:
        record = {"t": round(time.time(), 6), "s": round(step_seconds, 6),
                  "chunks": [list(c) for c in chunks]}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._file.close()


class SchedulerCalibration:
    """The scheduler's side: times steps, feeds the calibrator, swaps the policy's profile.

    Step time: the model runs step N from when it was scheduled, but not before step N-1's
    output arrived (one device, steps in sequence), until step N's output arrives::

        step_s(N) = t_update(N) - max(t_schedule(N), t_update(N-1))

    with t_schedule at the end of `schedule()` and t_update at the entry of
    `update_from_output()`. Synchronous engine: the execute-model time. Async scheduling (step
    N+1 scheduled while N runs): the time between consecutive outputs while the engine is busy.
    """

    def __init__(
        self,
        calibrator: StepTimeCalibrator,
        *,
        max_model_len: int,
        policy: Any = None,
        labels: Mapping[str, str] | None = None,
        clock: Any = time.perf_counter,
        fit: bool = True,
        step_log: StepLog | None = None,
    ) -> None:
        """Args:
        calibrator: the fit.
        max_model_len: longest prompt of the snapshot tables and gauge lengths.
        policy: an object with a `profile` attribute (FairwayPolicy) that gets each snapshot;
            None: only publish.
        labels: model_name, engine and policy labels of the gauge; None: no gauge (no
            `log_stats`).
        clock: seconds, monotonic.
        fit: feed the calibrator (False: only the step log is wanted).
        step_log: where each timed step is also written, or None.
        """
        self.calibrator = calibrator
        self.max_model_len = max_model_len
        self.policy = policy if hasattr(policy, "profile") else None
        self.profile: PrefillProfile | None = None
        self._clock = clock
        self.fit = fit
        self.step_log = step_log
        self._scheduled_at: dict[int, float] = {}
        self._last_update: float = -math.inf
        self._since_refresh = 0
        self._gauges = None
        if labels is not None:
            lengths = [n for n in GAUGE_LENGTHS if n <= max_model_len] or [max_model_len]
            gauge = _calibrated_gauge()
            self._gauges = {
                n: gauge.labels(labels["model_name"], labels["engine"], labels["policy"], str(n))
                for n in lengths
            }

    def on_schedule(self, scheduler_output: Any) -> None:
        """Call at the end of `schedule()`."""
        if len(self._scheduled_at) > 64:  # outputs never answered (aborted engine): forget
            self._scheduled_at.clear()
        self._scheduled_at[id(scheduler_output)] = self._clock()

    def on_update(self, scheduler_output: Any) -> None:
        """Call at the entry of `update_from_output()`, before vLLM processes the output."""
        now = self._clock()
        scheduled_at = self._scheduled_at.pop(id(scheduler_output), None)
        previous, self._last_update = self._last_update, now
        if scheduled_at is None or not scheduler_output.total_num_scheduled_tokens:
            return
        self.observe_step(scheduler_output, now - max(scheduled_at, previous))

    def observe_step(self, scheduler_output: Any, step_seconds: float) -> None:
        """Feed one step (its scheduler output and measured seconds); refresh now and then."""
        chunks = internals.step_chunks(scheduler_output)
        if self.step_log is not None:
            self.step_log.write(chunks, step_seconds)
        if not self.fit:
            return
        self.calibrator.observe(chunks, step_seconds)
        self._since_refresh += 1
        if self._since_refresh >= self.calibrator.settings.refresh_steps:
            self.refresh()

    def refresh(self) -> PrefillProfile | None:
        """Snapshot the fit: give it to the policy and the gauge (when usable)."""
        self._since_refresh = 0
        profile = self.calibrator.profile(self.max_model_len)
        if profile is None:
            return None
        first = self.profile is None
        self.profile = profile
        if self.policy is not None:
            self.policy.profile = profile  # read by FairwayPolicy._patience at the next step
        if self._gauges is not None:
            for n, series in self._gauges.items():
                series.set(profile.prefill_s(n))
        model = self.calibrator.model() if first else None  # set whenever a profile is
        if model is not None:
            logger.info(
                "Fairway self-calibration is in use after %d steps: step_s = %.4g + %.4g*tokens "
                "+ %.4g*pairs; T(2048) = %.4g s.",
                self.calibrator.num_used, model.overhead_s, model.per_token_s,
                model.per_pair_s, profile.prefill_s(2048),
            )
        return profile


def for_scheduler(scheduler: Any) -> SchedulerCalibration | None:
    """The step timer of a Fairway scheduler, or None unless `self_calibrate` or `step_log` is on.

    Reads `fairway_options`, `fairway_policy`, `fairway_metrics` and vLLM's `vllm_config`.
    """
    options = scheduler.fairway_options
    fit = bool(getattr(options, "self_calibrate", False))
    log_path = getattr(options, "step_log", None)
    if not fit and not log_path:
        return None
    config = internals.vllm_config(scheduler)
    metrics = getattr(scheduler, "fairway_metrics", None)
    calibrator = StepTimeCalibrator(int(config.scheduler_config.max_num_batched_tokens))
    return SchedulerCalibration(
        calibrator,
        max_model_len=int(config.model_config.max_model_len),
        policy=scheduler.fairway_policy if fit else None,
        labels=None if metrics is None or not fit else dict(metrics.labels),
        fit=fit,
        step_log=StepLog(log_path) if log_path else None,
    )
