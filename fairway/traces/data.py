"""Where the source data of the trace builders lives, and `fairway data download` to fetch it.

The preset traces ship built inside the package (`fairway.traces.shipped`), so the benchmark and
the tests need none of this; the sources are read only to build a trace that is not shipped (other
seeds, shapes, loads or parameters) or to regenerate the shipped ones.

Resolution order of the data directory (`data_dir`):

1. ``$FAIRWAY_DATA`` when set (used as is, even if it does not exist yet);
2. ``../shared/data`` next to the current directory, then next to the repository that holds this
   package (the layout of the development checkout);
3. the user cache directory, ``platformdirs.user_cache_dir("fairway")/data``, which is also where
   `download` writes by default.

`data_file` looks for a file in that order and takes the first directory that has it (so a file
downloaded into the cache is found even when ../shared/data exists); with ``$FAIRWAY_DATA`` set,
only there.

Each downloaded file is checked against the sha256 recorded in `SOURCES`. Two files are special:
the SEC 10-K sample is a merge of 142 upstream JSON files (its check is on the decompressed
content, since gzip headers differ), and ``financebench_filing_pages.jsonl.gz`` is derived (page
text extracted from FinanceBench's filing PDFs) and has no download: `download` says so. Without
it the SEC families build only with ``--param sources=10k`` (so the shipped `sec-*` presets, which
use both corpora, cannot be regenerated); every other source downloads.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import httpx

from fairway.errors import TraceError

logger = logging.getLogger(__name__)

ENV_VAR = "FAIRWAY_DATA"


class MissingDataError(TraceError):
    """A source data file is not in the data directory (the message says how to get it)."""


_MOONCAKE_COMMIT = "3b5a594133958449a1feaf1c9e0fc1b553e34a28"
_FINANCEBENCH_COMMIT = "cc39aeb4afdf33909ee1412188bf89035950c2eb"
_MIGRES_COMMIT = "1de6265c9ca1014054d6ba875738e785830908f8"
_SEC_NOTEBOOKS_COMMIT = "7876ec2e40ede21c968ea1f3e624aa944d241b0e"
_RAW = "https://raw.githubusercontent.com"

#: Accession numbers of the 142 FY2023 10-K files in neo4j-examples/sec-edgar-notebooks
#: (``data/all/form10k/<accession>.json``), in the order of the merged file.
_SEC_10K_ACCESSIONS_TEXT = (
    "0000004457-23-000052 0000008670-23-000030 0000008858-23-000029 0000014693-23-000074 "
    "0000016058-23-000086 0000017843-23-000021 0000037472-23-000024 0000055529-23-000013 "
    "0000056701-23-000026 0000057131-23-000032 0000057515-23-000017 0000076334-23-000042 "
    "0000080424-23-000073 0000091419-23-000072 0000096021-23-000117 0000106040-23-000024 "
    "0000107140-23-000092 0000108385-23-000022 0000109563-23-000075 0000319201-23-000031 "
    "0000320187-23-000039 0000353184-23-000071 0000707549-23-000102 0000709283-23-000013 "
    "0000716643-23-000031 0000717538-23-000132 0000726958-23-000059 0000779152-23-000062 "
    "0000794619-23-000040 0000807863-23-000049 0000849146-23-000102 0000866729-23-000019 "
    "0000886158-23-000059 0000891024-23-000006 0000897101-23-000380 0000910406-23-000053 "
    "0000912093-23-000037 0000915358-23-000008 0000915779-23-000046 0000918965-23-000023 "
    "0000939057-23-000178 0000939930-23-000052 0000940944-23-000037 0000950170-23-026915 "
    "0000950170-23-027474 0000950170-23-027948 0000950170-23-029412 0000950170-23-030037 "
    "0000950170-23-030121 0000950170-23-030394 0000950170-23-032298 0000950170-23-032889 "
    "0000950170-23-032929 0000950170-23-032988 0000950170-23-033201 0000950170-23-034640 "
    "0000950170-23-035122 0000950170-23-035840 0000950170-23-035904 0000950170-23-042861 "
    "0000950170-23-043011 0000950170-23-043521 0000950170-23-043659 0000950170-23-044490 "
    "0000950170-23-045222 0001001250-23-000112 0001002638-23-000022 0001024305-23-000060 "
    "0001049521-23-000031 0001062993-23-016652 0001084765-23-000016 0001096906-23-001489 "
    "0001104659-23-074920 0001104659-23-096477 0001116132-23-000020 0001137789-23-000049 "
    "0001140361-23-029664 0001171843-23-004114 0001185185-23-000693 0001213900-23-052460 "
    "0001213900-23-057011 0001213900-23-061380 0001213900-23-066312 0001262976-23-000051 "
    "0001299709-23-000198 0001304492-23-000030 0001327567-23-000024 0001375365-23-000036 "
    "0001376474-23-000411 0001377789-23-000023 0001383312-23-000037 0001387467-23-000049 "
    "0001391127-23-000016 0001408710-23-000028 0001410578-23-001442 0001410578-23-001494 "
    "0001437749-23-016924 0001437749-23-017258 0001437749-23-018305 0001437749-23-018790 "
    "0001437749-23-020727 0001437749-23-020982 0001437749-23-022156 0001437749-23-024609 "
    "0001493152-23-022974 0001493152-23-028498 0001558370-23-011469 0001558370-23-011516 "
    "0001558370-23-011650 0001558370-23-012203 0001558370-23-014509 0001558370-23-015003 "
    "0001558370-23-015226 0001558370-23-015357 0001562762-23-000287 0001564708-23-000368 "
    "0001577916-23-000014 0001590976-23-000069 0001591698-23-000115 0001596993-23-000033 "
    "0001606757-23-000033 0001613103-23-000040 0001628280-23-023126 0001628280-23-023772 "
    "0001628280-23-023849 0001628280-23-024860 0001628280-23-025464 0001628280-23-027335 "
    "0001628280-23-029065 0001628280-23-030374 0001636519-23-000009 0001639825-23-000132 "
    "0001650372-23-000040 0001654954-23-009305 0001654954-23-011271 0001683168-23-004329 "
    "0001683168-23-004487 0001683168-23-005175 0001707753-23-000021 0001786352-23-000054 "
    "0001795250-23-000017 0001838862-23-000027 "
)
SEC_10K_ACCESSIONS: tuple[str, ...] = tuple(_SEC_10K_ACCESSIONS_TEXT.split())


@dataclass(frozen=True)
class DataSource:
    """One file of the data directory and how to get it.

    Attributes:
        name: path relative to the data directory (``mooncake/conversation_trace.jsonl``).
        sha256: of the file, or for ``merge`` sources of its decompressed content.
        kind: ``file`` (one URL, stored as is), ``merge`` (the 10-K sample: one URL per part,
            merged into gzipped JSON lines) or ``derived`` (no public source).
        urls: the download URL(s).
        note: origin and license, printed by `fairway data download`.
    """

    name: str
    sha256: str
    kind: str
    urls: tuple[str, ...] = ()
    note: str = ""


SOURCES: tuple[DataSource, ...] = (
    DataSource(
        "mooncake/conversation_trace.jsonl",
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        "file",
        (f"{_RAW}/kvcache-ai/Mooncake/{_MOONCAKE_COMMIT}/FAST25-release/traces/"
         "conversation_trace.jsonl",),
        "Mooncake FAST'25 conversation trace (Apache-2.0)",
    ),
    DataSource(
        "financebench/financebench_open_source.jsonl",
        "a5a2aa673e573e55675fc3c0f9aa38c1cf59d2abc91edb077534f71f10a71877",
        "file",
        (f"{_RAW}/patronus-ai/financebench/{_FINANCEBENCH_COMMIT}/data/"
         "financebench_open_source.jsonl",),
        "FinanceBench questions (CC BY-NC 4.0 per the HF copy: research use, cite the paper)",
    ),
    DataSource(
        "financebench/financebench_document_information.jsonl",
        "1c69127783879de8cdadb159d2181f39bc3123b8e0ebf74031c3969d69189575",
        "file",
        (f"{_RAW}/patronus-ai/financebench/{_FINANCEBENCH_COMMIT}/data/"
         "financebench_document_information.jsonl",),
        "FinanceBench filing metadata (CC BY-NC 4.0 per the HF copy)",
    ),
    DataSource(
        "financebench/financebench_filing_pages.jsonl.gz",
        "436c724361780bdb66da8dfbc8f3a6f37e3e899e635b90df3231036b71596b6a",
        "derived",
        (),
        "page text of 74 FinanceBench filings, extracted with pypdfium2 from the PDFs in "
        f"patronus-ai/financebench@{_FINANCEBENCH_COMMIT[:7]} pdfs/ (one JSON line per page: "
        "doc_name, zero-based page_num, text); Fairway has no download or extractor for it",
    ),
    DataSource(
        "musique/musique_ans_v1.0_dev.subset200.jsonl",
        "bbc98ab676941cf3a481cb3361cfab334cd2a24c74ed42473e4d5c14cf7577d4",
        "file",
        (f"{_RAW}/AdelWang/MIGRES/{_MIGRES_COMMIT}/data/musique.json",),
        "MuSiQue-Ans dev subset, 200 questions (CC BY 4.0)",
    ),
    DataSource(
        "sec_filings/sec_10k_fy2023_sections.jsonl.gz",
        "3d7be9827633cf55a59a8be055e86bdd3e122f11a5ece1d4b8c42bdd88d4c4cb",
        "merge",
        tuple(
            f"{_RAW}/neo4j-examples/sec-edgar-notebooks/{_SEC_NOTEBOOKS_COMMIT}/data/all/form10k/"
            f"{acc}.json"
            for acc in SEC_10K_ACCESSIONS
        ),
        "142 FY2023 10-K filings, four sections each (public EDGAR text; repository unlicensed)",
    ),
)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    import platformdirs  # imported here: only the fallback needs it

    return Path(platformdirs.user_cache_dir("fairway")) / "data"


def candidate_dirs() -> list[tuple[Path, str]]:
    """Data directories in precedence order, each with where it comes from (for messages)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return [(Path(env).expanduser(), f"${ENV_VAR}")]
    out: list[tuple[Path, str]] = []
    for base, how in ((Path.cwd(), "current directory"), (_repo_root(), "repository")):
        candidate = (base.parent / "shared" / "data").resolve()
        if candidate.is_dir() and all(candidate != c for c, _ in out):
            out.append((candidate, f"../shared/data next to the {how}"))
    out.append((cache_dir(), "user cache directory"))
    return out


def resolve_data_dir() -> tuple[Path, str]:
    """The data directory and where the choice came from (for messages)."""
    return candidate_dirs()[0]


def data_dir() -> Path:
    """The directory holding the workload data (see the module docstring for the order)."""
    return resolve_data_dir()[0]


def source(name: str) -> DataSource:
    """The `DataSource` of a relative file name."""
    for src in SOURCES:
        if src.name == name:
            return src
    raise TraceError(f"unknown data file {name!r}; known: {', '.join(s.name for s in SOURCES)}")


def data_file(name: str) -> Path:
    """Path of a data file (relative `name`); a `TraceError` says how to get it when missing."""
    dirs = candidate_dirs()
    for root, _ in dirs:
        if (root / name).is_file():
            return root / name
    src = next((s for s in SOURCES if s.name == name), None)
    if src is not None and src.kind == "derived":
        fix = (f"it cannot be downloaded ({src.note}); set ${ENV_VAR} to a directory that "
               "holds it")
    else:
        fix = (f"run `fairway data download` to fetch it (into {_default_dest()}), or set "
               f"${ENV_VAR} to a directory that holds it")
    where = ", ".join(f"{root} ({how})" for root, how in dirs)
    raise MissingDataError(f"data file {name} not found in {where}; {fix}")


@lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 of a file (memoized on path, size and mtime: builders record it in headers)."""
    st = os.stat(path)
    return _sha256_cached(str(path), st.st_size, st.st_mtime_ns)


# --------------------------------------------------------------------------------------------
# Download


@dataclass(frozen=True)
class DownloadResult:
    """What `download` did with one source: ``ok``, ``present``, ``skipped`` (derived)."""

    name: str
    status: str
    path: Path
    message: str


def _default_dest() -> Path:
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else cache_dir()


def _content_sha256(src: DataSource, path: Path) -> str:
    if src.kind == "merge":
        h = hashlib.sha256()
        with gzip.open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    return file_sha256(path)


def _fetch(client: httpx.Client, url: str) -> bytes:
    try:
        response = client.get(url)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise TraceError(f"download of {url} failed: {exc}") from None
    return response.content


def _merge_10k(client: httpx.Client, urls: Sequence[str]) -> bytes:
    """Rebuild the 10-K sample: each upstream JSON with an ``accession`` field added first."""
    lines = []
    for url in urls:
        accession = url.rsplit("/", 1)[-1].removesuffix(".json")
        try:
            record = json.loads(_fetch(client, url))
        except json.JSONDecodeError as exc:
            raise TraceError(f"download of {url}: not JSON ({exc})") from None
        lines.append(json.dumps({"accession": accession, **record}, ensure_ascii=False) + "\n")
    return "".join(lines).encode("utf-8")


def _write_atomic(path: Path, data: bytes, gzipped: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            if gzipped:
                with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
                    gz.write(data)
            else:
                f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def download(
    dest: str | Path | None = None,
    sources: Iterable[DataSource] = SOURCES,
    client: httpx.Client | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[DownloadResult]:
    """Fetch every downloadable source into `dest`, verifying sha256 before anything is written.

    Args:
        dest: target directory (default ``$FAIRWAY_DATA`` or the user cache directory).
        sources: what to fetch (default: all of `SOURCES`).
        client: an httpx client (tests pass one with a mock transport).
        force: download even when a file with the right checksum is present.
        progress: called with one line per file.

    Raises:
        TraceError: after trying every source, if any download failed or had a wrong checksum
            (that file is not written; the others are kept).
    """
    root = Path(dest).expanduser() if dest is not None else _default_dest()
    say = progress or (lambda line: logger.info("%s", line))
    own = client is None
    client = client or httpx.Client(follow_redirects=True, timeout=120.0)
    results = []
    failures: list[str] = []
    try:
        for src in sources:
            path = root / src.name
            if src.kind == "derived":
                status = "present" if path.is_file() else "skipped"
                state = "present" if path.is_file() else "NOT downloadable"
                msg = f"{src.name}: {state}: {src.note}"
                say(msg)
                results.append(DownloadResult(src.name, status, path, msg))
                continue
            if not force and path.is_file() and _content_sha256(src, path) == src.sha256:
                msg = f"{src.name}: already present, checksum ok"
                say(msg)
                results.append(DownloadResult(src.name, "present", path, msg))
                continue
            say(f"{src.name}: downloading {len(src.urls)} file(s)")
            try:
                result = _download_one(client, src, path)
            except TraceError as exc:
                say(f"{src.name}: FAILED: {exc}")
                failures.append(str(exc))
                continue
            say(result.message)
            results.append(result)
    finally:
        if own:
            client.close()
    if failures:
        raise TraceError(f"{len(failures)} download(s) failed: " + "; ".join(failures))
    return results


def _download_one(client: httpx.Client, src: DataSource, path: Path) -> DownloadResult:
    data = _merge_10k(client, src.urls) if src.kind == "merge" else _fetch(client, src.urls[0])
    got = hashlib.sha256(data).hexdigest()
    if got != src.sha256:
        raise TraceError(
            f"{src.name}: sha256 mismatch: expected {src.sha256}, got {got} "
            f"(from {src.urls[0]}{' ...' if len(src.urls) > 1 else ''}); the upstream "
            "file changed or the download was corrupted; nothing was written"
        )
    _write_atomic(path, data, gzipped=src.kind == "merge")
    msg = f"{src.name}: ok ({len(data):,} bytes, sha256 verified) -- {src.note}"
    return DownloadResult(src.name, "ok", path, msg)
