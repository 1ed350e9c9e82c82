"""Data directory resolution and `fairway data download` (offline, with a mock transport)."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import httpx
import pytest

from fairway.errors import TraceError
from fairway.traces import data
from fairway.traces.data import DataSource, data_dir, data_file, download, resolve_data_dir


def test_env_var_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRWAY_DATA", str(tmp_path / "mine"))
    assert data_dir() == tmp_path / "mine"
    assert resolve_data_dir()[1] == "$FAIRWAY_DATA"


def test_shared_data_next_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAIRWAY_DATA", raising=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert data_dir() == (tmp_path / "shared" / "data").resolve()


def test_shared_data_next_to_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAIRWAY_DATA", raising=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    monkeypatch.setattr(data, "_repo_root", lambda: tmp_path / "repo")
    (tmp_path / "x" / "y").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "x" / "y")  # ../shared/data from here does not exist
    assert resolve_data_dir() == (
        (tmp_path / "shared" / "data").resolve(), "../shared/data next to the repository")


def test_cache_dir_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAIRWAY_DATA", raising=False)
    monkeypatch.setattr(data, "_repo_root", lambda: tmp_path / "a" / "repo")
    monkeypatch.setattr(data, "cache_dir", lambda: tmp_path / "cache" / "data")
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    assert resolve_data_dir() == (tmp_path / "cache" / "data", "user cache directory")


def test_real_cache_dir_is_under_fairway() -> None:
    path = data.cache_dir()
    assert path.name == "data" and "fairway" in str(path)


def test_missing_file_says_how_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRWAY_DATA", str(tmp_path))
    with pytest.raises(TraceError) as err:
        data_file("mooncake/conversation_trace.jsonl")
    assert "mooncake/conversation_trace.jsonl" in str(err.value)
    assert "fairway data download" in str(err.value)
    with pytest.raises(TraceError, match="cannot be downloaded"):
        data_file("financebench/financebench_filing_pages.jsonl.gz")


def _client(routes: dict[str, bytes], calls: list[str]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        body = routes.get(str(request.url))
        return httpx.Response(200, content=body) if body is not None else httpx.Response(404)

    return httpx.Client(transport=httpx.MockTransport(handler))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_download_verifies_and_skips_present(tmp_path: Path) -> None:
    body = b'{"timestamp": 0}\n'
    src = DataSource("x/a.jsonl", _sha(body), "file", ("https://example.test/a.jsonl",))
    calls: list[str] = []
    results = download(tmp_path, [src], client=_client({src.urls[0]: body}, calls))
    assert [r.status for r in results] == ["ok"]
    assert (tmp_path / "x" / "a.jsonl").read_bytes() == body
    again = download(tmp_path, [src], client=_client({src.urls[0]: body}, calls))
    assert [r.status for r in again] == ["present"] and len(calls) == 1


def test_download_sha256_mismatch_writes_nothing(tmp_path: Path) -> None:
    src = DataSource("x/a.jsonl", "0" * 64, "file", ("https://example.test/a.jsonl",))
    with pytest.raises(TraceError) as err:
        download(tmp_path, [src], client=_client({src.urls[0]: b"tampered"}, []))
    assert "sha256 mismatch" in str(err.value) and "x/a.jsonl" in str(err.value)
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


def test_download_http_error(tmp_path: Path) -> None:
    src = DataSource("x/a.jsonl", "0" * 64, "file", ("https://example.test/missing",))
    with pytest.raises(TraceError, match="download of https://example.test/missing failed"):
        download(tmp_path, [src], client=_client({}, []))


def test_download_merges_10k_parts(tmp_path: Path) -> None:
    parts = {
        "https://example.test/form10k/0001-23-000001.json": {"item1": "Business é", "cik": "1"},
        "https://example.test/form10k/0002-23-000002.json": {"item1": "Other", "cik": "2"},
    }
    content = "".join(
        json.dumps({"accession": u.rsplit("/", 1)[1][:-5], **v}, ensure_ascii=False) + "\n"
        for u, v in parts.items()
    ).encode()
    src = DataSource("sec/s.jsonl.gz", _sha(content), "merge", tuple(parts))
    routes = {u: json.dumps(v).encode() for u, v in parts.items()}
    download(tmp_path, [src], client=_client(routes, []))
    with gzip.open(tmp_path / "sec" / "s.jsonl.gz", "rb") as f:
        assert f.read() == content


def test_derived_file_is_reported_not_fetched(tmp_path: Path) -> None:
    src = DataSource("fb/pages.jsonl.gz", "0" * 64, "derived", (), "extracted from PDFs")
    calls: list[str] = []
    lines: list[str] = []
    results = download(tmp_path, [src], client=_client({}, calls), progress=lines.append)
    assert results[0].status == "skipped" and not calls
    assert "NOT downloadable" in lines[0]


def test_sources_match_readme_commits() -> None:
    urls = [u for s in data.SOURCES for u in s.urls]
    assert any("kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28" in u for u in urls)
    assert len(data.SEC_10K_ACCESSIONS) == 142
    assert all(len(s.sha256) == 64 for s in data.SOURCES)


def test_file_found_in_later_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ../shared/data exists but lacks the file; the downloaded copy in the cache is used.
    monkeypatch.delenv("FAIRWAY_DATA", raising=False)
    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setattr(data, "_repo_root", lambda: tmp_path / "work")
    cache = tmp_path / "cache" / "data"
    monkeypatch.setattr(data, "cache_dir", lambda: cache)
    (cache / "musique").mkdir(parents=True)
    (cache / "musique" / "m.jsonl").write_text("{}\n")
    assert data_dir() == (tmp_path / "shared" / "data").resolve()
    assert data_file("musique/m.jsonl") == cache / "musique" / "m.jsonl"


def test_one_failure_does_not_stop_the_others(tmp_path: Path) -> None:
    good = b"fine\n"
    bad = DataSource("x/bad.txt", "0" * 64, "file", ("https://example.test/bad",))
    ok = DataSource("x/ok.txt", _sha(good), "file", ("https://example.test/ok",))
    routes = {"https://example.test/bad": b"evil", "https://example.test/ok": good}
    with pytest.raises(TraceError, match="1 download\\(s\\) failed: x/bad.txt: sha256 mismatch"):
        download(tmp_path, [bad, ok], client=_client(routes, []))
    assert (tmp_path / "x" / "ok.txt").read_bytes() == good
    assert not (tmp_path / "x" / "bad.txt").exists()
