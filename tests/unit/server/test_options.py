"""The server's options, declared once (`ServeOptions` and its flags): the job's command line, the entry
point's parser, the router's replica command and `evaluate deploy` all read that one declaration."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.server.options import ServeOptions
from ckpteval.server.router import replica_command
from tests.deploy_support import free_port
from tests.unit.server.test_cli import assert_clean_failure, run

EVERY_SETTING = ServeOptions(
    checkpoint=Path("/ck/one"),
    port=8123,
    host="0.0.0.0",
    served_model_name="m",
    device="cpu",
    dtype="bfloat16",
    max_batch_size=4,
    max_batch_tokens=999,
    prepare="tiny",
    replicas=3,
    tokenizer="acme/tok",
    ignore_unexpected_tensors=True,
    publish_tokenizer=Path("/job/tokenizer"),
    prefix_cache=False,
    prefix_cache_mib=7,
    access_log=True,
    identity="inv-1",
    port_file=Path("/job/state/port"),
    port_fallback=True,
)


def test_every_field_has_one_flag_in_field_order() -> None:
    assert [flag.field for flag in ServeOptions.flags()] == [f.name for f in dataclasses.fields(ServeOptions)]


def test_the_command_line_decodes_to_the_same_options() -> None:
    argv = EVERY_SETTING.to_argv("/venv/bin/python")
    assert argv[:4] == ["/venv/bin/python", "-m", "ckpteval.server", "serve"]
    assert ServeOptions.from_argv(argv[4:]) == EVERY_SETTING
    defaults = ServeOptions(checkpoint=Path("/ck"))
    assert ServeOptions.from_argv(defaults.to_argv()[4:]) == defaults


def test_a_default_is_left_off_the_command_line_unless_it_is_always_written() -> None:
    argv = ServeOptions(checkpoint=Path("/ck")).to_argv("python")[4:]
    always = ["--checkpoint", "/ck", "--port", "8000", "--host", "127.0.0.1", "--served-model-name", "megatron-model"]
    assert argv == [*always, "--device", "auto"]


def test_the_prefix_cache_switch_travels_both_ways() -> None:
    off = ServeOptions(checkpoint=Path("/ck"), prefix_cache=False).to_argv("python")
    assert off[-1] == "--no-prefix-cache"
    assert ServeOptions.from_argv(["--checkpoint", "/ck", "--no-prefix-cache"]).prefix_cache is False
    assert ServeOptions.from_argv(["--checkpoint", "/ck", "--prefix-cache"]).prefix_cache is True


def test_a_replica_runs_the_same_options_on_its_own_port_as_one_process() -> None:
    argv = replica_command(EVERY_SETTING, 9001)
    assert argv[:4] == [sys.executable, "-m", "ckpteval.server", "serve"]
    assert ServeOptions.from_argv(argv[4:]) == dataclasses.replace(
        EVERY_SETTING,
        port=9001,
        host="127.0.0.1",
        replicas=1,
        prepare=None,
        publish_tokenizer=None,
        access_log=False,
        port_file=None,
        port_fallback=False,
    )


def test_the_entry_point_parses_what_the_job_writes() -> None:
    argv = EVERY_SETTING.to_argv(sys.executable)
    result = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ServeOptions.flags():
        assert flag.name in result.stdout


def test_evaluate_deploy_offers_the_flags_marked_for_it() -> None:
    result = CliRunner().invoke(app, ["deploy", "--help"], terminal_width=200)
    assert result.exit_code == 0
    offered = [flag.name for flag in ServeOptions.flags() if flag.cli]
    assert "--prefix-cache" in offered and "--access-log" in offered
    for name in offered:
        assert name in result.output
    assert "--no-prefix-cache" in result.output
    for flag in ServeOptions.flags():
        if not flag.cli:
            assert flag.name not in result.output


def test_evaluate_deploy_hands_its_options_to_the_server(tmp_path: Path) -> None:
    port = str(free_port())
    result = run("deploy", "--checkpoint", str(tmp_path / "nope"), "--port", port, "--prefix-cache-mib", "0")
    assert_clean_failure(result, "--prefix-cache-mib must be at least 1, not 0.")
    result = run(
        "deploy", "--checkpoint", str(tmp_path / "nope"), "--port", port, "--no-prefix-cache", "--prefix-cache-mib", "0"
    )
    assert_clean_failure(result, "does not exist")  # the budget is not checked with the cache off
