"""Every test runs hermetically: an empty home, an empty data directory, no FAIRWAY_* settings.

So the suite proves what a fresh machine sees (the shipped preset traces, no `../shared/data`, no
user cache, no options from the caller's shell), wherever it runs. The caller's data directory is
captured first for the few tests that check builds from the source data: they take the
`source_data_dir` or `sources` fixture, which read ``$FAIRWAY_SOURCE_DATA`` when set, else the
directory the code itself would use outside the tests (``$FAIRWAY_DATA`` or ``../shared/data``),
and skip, with the reason, when that directory is absent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Where the tests that build from the source data look for it.
SOURCE_ENV_VAR = "FAIRWAY_SOURCE_DATA"


def _caller_source_dir() -> tuple[Path, str]:
    explicit = os.environ.get(SOURCE_ENV_VAR)
    if explicit:
        return Path(explicit).expanduser(), f"${SOURCE_ENV_VAR}"
    from fairway.traces.data import resolve_data_dir

    path, how = resolve_data_dir()
    return path, f"{how}; set ${SOURCE_ENV_VAR} to use another"


_SOURCE_DIR, _SOURCE_HOW = _caller_source_dir()


@pytest.fixture(scope="session", autouse=True)
def hermetic_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """HOME is an empty directory, FAIRWAY_DATA an empty data directory, other FAIRWAY_* unset.

    Session-wide (and so in place before any module fixture); the test settings
    (``TEST_FAIRWAY_*``, not ``FAIRWAY_*``) are kept. Yields the empty data directory.
    """
    root = tmp_path_factory.mktemp("hermetic")
    (root / "home").mkdir()
    (root / "no-data").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("FAIRWAY_"):
                mp.delenv(key)
        mp.delenv("XDG_CACHE_HOME", raising=False)  # the user cache lives under HOME
        mp.setenv("HOME", str(root / "home"))
        mp.setenv("FAIRWAY_DATA", str(root / "no-data"))
        yield root / "no-data"


@pytest.fixture(scope="session")
def source_data_path() -> Path | None:
    """The source data directory, or None where it is absent (the test decides)."""
    return _SOURCE_DIR if _SOURCE_DIR.is_dir() else None


@pytest.fixture(scope="session")
def source_data_dir(source_data_path: Path | None) -> Path:
    """The source data directory (for tests of builds from the sources); skips when absent."""
    if source_data_path is None:
        pytest.skip(f"source data directory {_SOURCE_DIR} ({_SOURCE_HOW}) is absent: this test "
                    "checks a build from the source data (every preset also ships built)")
    return source_data_path


@pytest.fixture
def sources(source_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """FAIRWAY_DATA set to the source data directory for this test."""
    monkeypatch.setenv("FAIRWAY_DATA", str(source_data_dir))
    return source_data_dir
