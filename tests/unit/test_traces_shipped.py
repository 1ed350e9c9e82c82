"""The preset traces shipped in the package: complete, current, equal to a rebuild, used by default.

The suite runs without source data (tests/conftest.py): everything here but the rebuild of a
preset that needs the sources runs everywhere; that rebuild is skipped, with the reason, where the
sources are absent (the `flood` preset is synthetic and always rebuilt).
"""

from __future__ import annotations

import gzip
import logging
import zlib
from pathlib import Path

import pytest

from fairway.cli import main
from fairway.replay.bench import load_trace_spec
from fairway.traces.build import PRESETS, quick_overrides
from fairway.traces.data import MissingDataError
from fairway.traces.format import load_trace, trace_bytes
from fairway.traces.shipped import (
    PRESET_DIR,
    header_mismatch,
    preset_trace,
    shipped_path,
    shipped_trace,
    variants,
    write_presets,
)


def test_every_registered_preset_ships_both_variants_and_nothing_else() -> None:
    expected = {name for preset in PRESETS for name in variants(preset)}
    assert expected == {f"{p}{q}.jsonl.gz" for p in PRESETS for q in ("", "-quick")}
    present = {p.name for p in PRESET_DIR.iterdir()}
    assert expected - present == set(), (
        "regenerate: fairway trace build --all-presets --into fairway/traces/presets")
    assert present - expected == set(), "files for presets that are not registered"


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_shipped_header_matches_the_registry(name: str, quick: bool) -> None:
    trace = load_trace(shipped_path(name, quick))
    assert header_mismatch(trace, name, quick) == []
    assert trace.header.num_requests == len(trace) > 0
    assert shipped_trace(name, quick=quick) == trace  # so the default path uses it


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_shipped_files_equal_a_rebuild_from_the_sources(name: str, tmp_path: Path,
                                                        source_data_path: Path | None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if source_data_path is not None:
        monkeypatch.setenv("FAIRWAY_DATA", str(source_data_path))
    try:
        written = write_presets(tmp_path, [name])
    except MissingDataError as exc:
        pytest.skip(str(exc))
    assert sorted(p.name for p in written) == sorted(variants(name))
    for path in written:
        shipped = shipped_path(name, quick=path.name.endswith("-quick.jsonl.gz")).read_bytes()
        assert gzip.decompress(shipped) == gzip.decompress(path.read_bytes()), (
            f"{path.name} is stale: fairway trace build --all-presets --into {PRESET_DIR}")
        assert shipped == path.read_bytes(), (
            f"{path.name}: same content, other gzip bytes (zlib {zlib.ZLIB_RUNTIME_VERSION})")


def test_the_benchmark_loads_presets_without_data() -> None:
    # tests/conftest.py points FAIRWAY_DATA at an empty directory.
    for name in ("sec-a", "sec-b"):
        full = load_trace_spec(name)
        quick = load_trace_spec(name, quick=True)
        assert full == load_trace(shipped_path(name))
        assert quick == load_trace(shipped_path(name, quick=True))
        assert quick.header.shape == quick_overrides(name)["shape"]
        assert len(quick) < len(full)


#: A shipped file stays small: the package carries every preset twice.
MAX_SHIPPED_BYTES = 1_000_000


def test_every_shipped_file_is_well_under_a_megabyte() -> None:
    sizes = {p.name: p.stat().st_size for p in PRESET_DIR.iterdir()}
    assert {n: s for n, s in sizes.items() if s >= MAX_SHIPPED_BYTES} == {}


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_the_long_context_presets_load_without_data(quick: bool) -> None:
    # tests/conftest.py points FAIRWAY_DATA at an empty directory.
    mooncake = load_trace_spec("mooncake-long", quick=quick)
    longest = max(r.prompt_tokens for r in mooncake.requests)
    assert 100_000 < longest <= 131_072  # beyond the 32k the other presets stop at
    assert mooncake.header.params["max_prompt_tokens"] == 131_072
    assert mooncake.header.info["num_capped"] == 0
    hits = load_trace_spec("hit-heavy-long", quick=quick)
    assert max(r.prompt_tokens for r in hits.requests) == 65_536 + 256
    assert hits == load_trace(shipped_path("hit-heavy-long", quick))


def test_other_variants_need_the_sources_and_say_so(tmp_path: Path) -> None:
    with pytest.raises(MissingDataError) as err:
        load_trace_spec("sec-a", capacity_tps=1000.0, cache_dir=tmp_path)
    message = str(err.value)
    assert "preset sec-a with capacity_tps=1000 is not one of the shipped traces" in message
    assert "financebench" in message and "FAIRWAY_DATA" in message
    with pytest.raises(MissingDataError, match="preset mooncake with load=1.3 is not one"):
        preset_trace("mooncake", load=1.3)
    with pytest.raises(MissingDataError,
                       match="^the --quick variant of preset sec-b with zipf_s=2 is not one"):
        preset_trace("sec-b", quick=True, zipf_s=2)
    assert list(tmp_path.iterdir()) == []  # nothing cached


def test_a_synthetic_variant_builds_without_data() -> None:
    trace = preset_trace("flood", shape="backlog:1.3:10,flood:0.9:10,calm:0.3:10")
    assert trace.header.preset == "flood" and trace.header.duration_s == 30.0


def test_a_stale_shipped_file_is_not_used(monkeypatch: pytest.MonkeyPatch,
                                          caplog: pytest.LogCaptureFixture) -> None:
    changed = {**PRESETS["flood"], "seed": 77}
    monkeypatch.setitem(PRESETS, "flood", changed)
    with caplog.at_level(logging.WARNING, logger="fairway.traces.shipped"):
        assert shipped_trace("flood", quick=True) is None
    assert "seed: file 6, wanted 77" in caplog.text and "--all-presets" in caplog.text
    trace = preset_trace("flood", quick=True)  # rebuilt: flood needs no data
    assert trace.header.seed == 77


def test_trace_build_of_a_preset_without_data_copies_the_shipped_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sec-a.jsonl.gz"
    assert main(["trace", "build", "sec-a", "-o", str(out)]) == 0
    assert "copying the shipped preset sec-a" in capsys.readouterr().err
    assert out.read_bytes() == shipped_path("sec-a").read_bytes()
    plain = tmp_path / "sec-a.jsonl"
    assert main(["trace", "build", "sec-a", "-o", str(plain)]) == 0
    assert plain.read_bytes() == trace_bytes(load_trace(shipped_path("sec-a")))


def test_trace_build_of_another_variant_without_data_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "build", "sec-a", "--seed", "9", "-o", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fairway: error: preset sec-a with seed=9 is not one of the shipped")
    assert "FAIRWAY_DATA" in err and not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--all-presets"],
        ["--all-presets", "--into", "d", "--seed", "3"],
        ["sec-a", "--all-presets", "--into", "d"],
        ["sec-a"],
        ["sec-a", "-o", "x.jsonl", "--into", "d"],
    ],
)
def test_trace_build_argument_combinations(args: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "build", *args]) == 2
    assert capsys.readouterr().err.startswith("fairway: error:")


def test_regeneration_command_writes_every_variant(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # Without data, only the synthetic preset can be rebuilt; a missing source writes nothing.
    assert main(["trace", "build", "--all-presets", "--into", str(tmp_path / "all")]) == 2
    assert "rebuilding preset sec-a needs its source data" in capsys.readouterr().err
    assert not (tmp_path / "all").exists()
    paths = write_presets(tmp_path / "flood", ["flood"])
    assert [p.read_bytes() for p in paths] == [
        shipped_path("flood").read_bytes(), shipped_path("flood", quick=True).read_bytes()]


def test_the_package_data_ships_the_files() -> None:
    # A wheel carries what pyproject.toml's package-data names; every shipped file must match.
    import fnmatch
    import tomllib

    root = PRESET_DIR.parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["fairway"]
    for path in PRESET_DIR.iterdir():
        relative = path.relative_to(root / "fairway").as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative
