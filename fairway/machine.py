"""What machine this is, for the records that name it (profile tables, benchmark JSON).

Standard library only, so that any module may import it.
"""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_model() -> str | None:
    """The CPU's model name from `/proc/cpuinfo` (Linux); None where it names none.

    `platform.processor()` is no substitute on Linux: it is often empty or just the architecture.
    """
    try:
        text = CPUINFO.read_text(encoding="utf-8")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return None
