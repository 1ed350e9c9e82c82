"""What the machine did while an end-to-end test waited, for the test's failure message.

A wait that runs out on a shared 2-core CI machine has causes that the message must tell apart:
the host starved the VM (steal time), a process spun or sat idle (its CPU seconds: an engine
stuck in a loop burns one core, a replay that never started burns none), or memory ran short.
`MachineWatch` takes a baseline when the wait starts and reports the differences since.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil


def _cpu_seconds(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return times.user + times.system


def _machine_seconds() -> dict[str, float]:
    """CPU seconds of the whole machine (all CPUs) by kind; steal is time the host took."""
    times = psutil.cpu_times()
    kinds = ("user", "system", "idle", "iowait", "steal")
    return {name: getattr(times, name, 0.0) for name in kinds}


@dataclass
class MachineWatch:
    """Machine and per-process CPU time since `start()` (plus memory and load now)."""

    started_at: float
    machine: dict[str, float]
    processes: dict[int, tuple[psutil.Process, float]] = field(default_factory=dict)

    @classmethod
    def start(cls, pids: Iterable[int] = ()) -> MachineWatch:
        watch = cls(time.monotonic(), _machine_seconds())
        watch.add(pids)
        return watch

    def add(self, pids: Iterable[int]) -> None:
        """Watch these processes too (their CPU time counts from now)."""
        for pid in pids:
            if pid in self.processes:
                continue
            try:
                proc = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
            seconds = _cpu_seconds(proc)
            if seconds is not None:
                self.processes[pid] = (proc, seconds)

    def report(self) -> str:
        wall = time.monotonic() - self.started_at
        now = _machine_seconds()
        spent = {name: now[name] - self.machine[name] for name in now}
        memory = psutil.virtual_memory()
        load = ", ".join(f"{x:.1f}" for x in psutil.getloadavg())
        lines = [
            f"machine over the last {wall:.0f} s ({psutil.cpu_count()} CPUs): "
            + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in spent.items())
            + f"; load {load}; {memory.available / 2**30:.1f} of "
            f"{memory.total / 2**30:.1f} GiB available",
        ]
        for pid, (proc, before) in sorted(self.processes.items()):
            seconds = _cpu_seconds(proc)
            try:
                name, rss = proc.name(), proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                lines.append(f"  pid {pid}: gone")
                continue
            used = "?" if seconds is None else f"{seconds - before:.1f}"
            lines.append(f"  pid {pid} {name}: {used} s CPU, {rss / 2**20:.0f} MiB resident")
        return "\n".join(lines)
