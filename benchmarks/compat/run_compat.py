#!/usr/bin/env python
"""Run vLLM's own scheduler tests (from a version's sdist) against Fairway, on that version's code.

`make compat` runs this. Steps, each cached under `.cache/compat/` (gitignored):

1. fetch the vLLM sdist of the version (`--vllm-version`, default the installed one) with pip
   (`pip download --no-binary vllm`);
   pip prepares the sdist's metadata, which imports torch and needs setuptools-rust, so this runs
   in a small helper environment that sees this one's packages (`VLLM_TARGET_DEVICE=empty`: no
   compilation, only the metadata);
2. extract `tests/` and `pyproject.toml` (not the `vllm/` sources, which would shadow the
   installed, compiled package);
3. install test-only dependencies missing here (`tblib`) into a side directory;
4. put stand-in configs of the Hub models the selected tests name (facebook/opt-125m, ...) into
   a private Hugging Face cache, so they resolve offline: the scheduler tests read the config,
   never weights. The tokenizer is Fairway's byte-level stand-in;
5. run pytest with the `fairway_compat` plugin, which substitutes FairwayScheduler /
   FairwayAsyncScheduler (policy fcfs) in upstream's `create_scheduler` harnesses and in the
   builders of upstream's priority-scheduling tests (`create_scheduler_with_priority`, ...:
   `--scheduling-policy priority`, the levels first, each in the policy's order). For a version
   other than the installed one, pytest runs on that release's Python code over the CPU build
   (`vllm_sources.overlay_env`: the overlay first on PYTHONPATH), so a version's tests meet its
   own scheduler. A selected test file the version's sdist does not have is reported as
   "missing in X, not run" and left out.

Usage: run_compat.py [--vllm-version X] [--policy fcfs] [--tests PATH ...] [-k EXPR]
                     [-- PYTEST_ARGS...]
Prints one summary line (`compat: vLLM X ...: PASS|FAIL`). Exit code: pytest's (0 when nothing
failed; skips and expected differences are reported with their reasons; an expected difference
that passes is stale and fails the run); 4 when no selected file exists in the version's sdist.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # vllm_sources (the overlay of another version's code)

#: The selection run by default (paths inside the sdist). See README.md for what each covers.
DEFAULT_TESTS = (
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_deferred_block_free.py",
    "tests/v1/core/test_worker_slot_overflow.py",
    "tests/v1/core/test_swa_inflight_window_free.py",
    "tests/v1/core/test_priority_preemption_bug.py",
    "tests/v1/core/test_priority_scheduler_random.py",
    "tests/v1/kv_connector/unit/test_remote_decode_lifecycle.py",
    "tests/v1/kv_connector/unit/test_remote_prefill_lifecycle.py",
    "tests/v1/kv_connector/unit/test_kv_connector_lifecycle.py",
    "tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py",
)

#: sha256 of sdists this script has fetched before; a mismatch stops the run (pip also checks the
#: index's hash; this pins what the README's results were measured on).
KNOWN_SHA256 = {
    "0.32.0": "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad",
    "0.33.0": "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
    "0.34.0": "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113",
}

#: Test-only imports of upstream's tests/conftest.py that vLLM's wheel does not pull in.
TEST_DEPS = {"tblib": "tblib"}

#: Stand-in configs for the Hub models the selected tests name. Architecture fields as published
#: on the Hub; the scheduler tests only read them (vocab, max length, attention shape).
_OPT_COMMON = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "activation_function": "relu",
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "max_position_embeddings": 2048,
    "vocab_size": 50272,
    "torch_dtype": "float16",
    "enable_bias": True,
    "layer_norm_elementwise_affine": True,
    "use_cache": True,
}
HUB_CONFIGS = {
    "facebook/opt-125m": {
        **_OPT_COMMON,
        "hidden_size": 768,
        "ffn_dim": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "word_embed_proj_dim": 768,
        "do_layer_norm_before": True,
    },
    "facebook/opt-350m": {
        **_OPT_COMMON,
        "hidden_size": 1024,
        "ffn_dim": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "word_embed_proj_dim": 512,
        "do_layer_norm_before": False,
    },
    "meta-llama/Llama-3.2-1B-Instruct": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "torch_dtype": "bfloat16",
    },
    # vLLM 0.33+: test_streaming_lookahead_hashes_follow_recomputed_kv builds its MTP speculative
    # config from this hybrid (Gated DeltaNet + attention, MoE) model's config
    "Qwen/Qwen3-Next-80B-A3B-Instruct": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_hidden_layers": 48,
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "partial_rotary_factor": 0.25,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000,
        "max_position_embeddings": 262144,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    },
    # vLLM 0.34+
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "max_window_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "attention_bias": False,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "max_position_embeddings": 40960,
        "use_sliding_window": False,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
    },
}
_SNAPSHOT = "0" * 40  # any commit id: the cache only needs refs/main to point at a snapshot


def installed_vllm_version() -> str:
    """The installed vLLM's upstream version (`vllm_sources.installed_version`)."""
    from vllm_sources import installed_version

    return installed_version()


def run(cmd: list[str], **kwargs: object) -> None:
    print("compat: $", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def fetch_sdist(version: str, cache: Path) -> Path:
    """The vLLM sdist, downloaded once with pip (the module docstring says why in a helper env)."""
    target = cache / "dl" / f"vllm-{version}.tar.gz"
    if target.exists():
        return target
    helper = cache / "pip-helper"
    python = helper / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(helper)])
        run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "setuptools>=77",
                "setuptools-rust",
                "setuptools-scm>=8",
                "wheel",
                "packaging",
                "jinja2",
            ]
        )
        # Appended to sys.path: the helper's own setuptools wins, torch comes from this env.
        site = Path(
            subprocess.check_output(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                text=True,
            ).strip()
        )
        (site / "zz_fairway_main_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {**os.environ, "VLLM_TARGET_DEVICE": "empty", "VLLM_VERSION_OVERRIDE": version}
    run(
        [
            str(python),
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            "vllm",
            "--no-build-isolation",
            f"vllm=={version}",
            "-d",
            str(target.parent),
        ],
        env=env,
    )
    check_sha256(target, version)
    return target


def check_sha256(sdist: Path, version: str) -> None:
    """Stop if a known version's sdist differs from the one the README's results came from."""
    want = KNOWN_SHA256.get(version)
    got = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if want is not None and got != want:
        sdist.unlink()
        raise SystemExit(f"compat: {sdist.name} has sha256 {got}, expected {want}; removed it")


def extract_tests(sdist: Path, dest: Path) -> Path:
    """`tests/` and `pyproject.toml` of the sdist under `dest` (once)."""
    stamp = dest / ".extracted"
    if stamp.exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    with tarfile.open(sdist) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        keep = [
            m
            for m in tar.getmembers()
            if m.name.startswith(f"{top}/tests/") or m.name == f"{top}/pyproject.toml"
        ]
        for member in keep:
            member.name = member.name[len(top) + 1 :]
        tar.extractall(dest, members=keep, filter="data")
    stamp.write_text(sdist.name + "\n")
    return dest


def install_test_deps(site: Path) -> None:
    """Install upstream's test-only imports that are missing here into `site` (not the venv)."""
    missing = [
        pkg
        for module, pkg in TEST_DEPS.items()
        if importlib.util.find_spec(module) is None and not (site / module).exists()
    ]
    if missing:
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(site),
                *missing,
            ]
        )


def write_hub_cache(hub: Path) -> None:
    """Stand-in snapshots of `HUB_CONFIGS` in Hugging Face's cache layout (offline resolution);
    a snapshot whose config differs from `HUB_CONFIGS` is rewritten."""
    from fairway.tiny_model import write_tokenizer

    for repo, config in HUB_CONFIGS.items():
        base = hub / f"models--{repo.replace('/', '--')}"
        snapshot = base / "snapshots" / _SNAPSHOT
        text = json.dumps(config, indent=1) + "\n"
        path = snapshot / "config.json"
        if path.exists() and path.read_text() == text:
            continue
        write_tokenizer(snapshot, vocab_size=512, max_len=_max_len(config))
        path.write_text(text)
        (base / "refs").mkdir(parents=True, exist_ok=True)
        (base / "refs" / "main").write_text(_SNAPSHOT)


def _max_len(config: dict[str, Any]) -> int:
    """The stand-in tokenizer's model_max_length: the model's, for text models; the text part's
    for a multimodal config."""
    for source in (config, config.get("text_config") or {}):
        if "max_position_embeddings" in source:
            return int(source["max_position_embeddings"])
    return 2048


def select_tests(tests: list[str], tests_dir: Path) -> tuple[list[str], list[str]]:
    """The selected test paths (or node ids) that the version's sdist has, and the ones it does
    not (upstream removes and renames test files between releases)."""
    present, missing = [], []
    for test in tests:
        (present if (tests_dir / test.split("::", 1)[0]).exists() else missing).append(test)
    return present, missing


def compat_env(
    version: str, installed: str, base: dict[str, str], paths: list[Path]
) -> dict[str, str]:
    """The environment pytest runs in: `paths` (this folder, the extracted tests, the test-only
    site) on PYTHONPATH, after the version's overlay when it is not the installed version."""
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(
        [*(str(p) for p in paths), base.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if version != installed:
        from vllm_sources import overlay_env

        env = overlay_env(version, env)
    return env


def summary_line(
    version: str, policy: str, summary: dict[str, Any] | None, missing: list[str], code: int
) -> str:
    """The one line a run ends with: the counts, the missing files, PASS or FAIL."""
    missing_part = f", {len(missing)} missing in {version} (not run)" if missing else ""
    if summary is None:
        return (
            f"compat: vLLM {version} (policy {policy}): no results (pytest exit {code})"
            f"{missing_part}: FAIL"
        )
    counts = summary["counts"]
    passed = (
        counts["passed with a Fairway scheduler"] + counts["passed without building a scheduler"]
    )
    stale = counts.get("stale expected differences (passed)", 0)
    parts = [
        f"{passed} passed ({counts['passed with a Fairway scheduler']} with a Fairway scheduler)",
        f"{counts['failed']} failed",
        f"{counts['expected differences (xfailed)']} expected differences",
        *([f"{stale} stale expected differences (passed)"] if stale else []),
        f"{counts['skipped']} skipped",
    ]
    verdict = "PASS" if code == 0 and not counts["failed"] and not stale else "FAIL"
    return f"compat: vLLM {version} (policy {policy}): {', '.join(parts)}{missing_part}: {verdict}"


def pytest_command(args: argparse.Namespace, tests_dir: Path, report: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "fairway_compat",
        "-p",
        "no:cacheprovider",
        "-c",
        str(tests_dir / "pyproject.toml"),
        "--rootdir",
        str(tests_dir),
        "-q",
        "-rfE",
        "--tb=short",
        *args.tests,
    ]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", "600"]
    if args.k:
        cmd += ["-k", args.k]
    return [*cmd, *args.pytest_args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vllm-version",
        default=None,
        help="the vLLM release whose tests run, on its own Python code (default: the installed "
        "one; another one runs over the CPU build through vllm_sources.overlay_env)",
    )
    parser.add_argument("--cache-dir", type=Path, default=ROOT / ".cache" / "compat")
    parser.add_argument(
        "--policy",
        default="fcfs",
        help="Fairway policy of the substituted schedulers (default fcfs: "
        "upstream's expected orders assume FCFS)",
    )
    parser.add_argument(
        "--tests", nargs="+", default=list(DEFAULT_TESTS), help="test paths inside the sdist"
    )
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    installed = installed_vllm_version()
    version = args.vllm_version or installed
    cache = args.cache_dir.resolve()
    tests_dir = extract_tests(fetch_sdist(version, cache), cache / f"vllm-{version}")
    args.tests, missing = select_tests(args.tests, tests_dir)
    for test in missing:
        print(f"compat: {test} missing in {version}, not run", flush=True)
    report = cache / f"results-vllm-{version}-{args.policy}.json"
    if not args.tests:
        print(f"compat: vLLM {version}: none of the selected test files is in its sdist: FAIL")
        return 4
    site = cache / "site"
    install_test_deps(site)
    hub = cache / "hf" / "hub"
    write_hub_cache(hub)
    base = {
        **os.environ,
        "FAIRWAY_POLICY": args.policy,
        "FAIRWAY_COMPAT_REPORT": str(report),
        "COMPAT_VLLM_VERSION": version,  # fairway_compat.VERSION_ENV
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(cache / "hf"),
        "HF_HUB_CACHE": str(hub),
    }
    env = compat_env(version, installed, base, [HERE, tests_dir, site])
    if version != installed:
        print(
            f"compat: vLLM {version}'s Python code over the installed {installed} build "
            f"(overlay {env['PYTHONPATH'].split(os.pathsep)[0]})",
            flush=True,
        )
    cmd = pytest_command(args, tests_dir, report)
    print("compat: $", " ".join(cmd), flush=True)
    if report.exists():
        report.unlink()
    code = subprocess.run(cmd, cwd=tests_dir, env=env).returncode
    summary = None
    if report.exists():
        results = json.loads(report.read_text())
        results.update(vllm=version, policy=args.policy, exit_code=code, missing=missing)
        report.write_text(json.dumps(results, indent=1) + "\n")
        summary = results["summary"]
    print(f"compat: results in {report}")
    print(summary_line(version, args.policy, summary, missing, code), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
