"""The command line's shape: subcommands beside the default action, help, examples."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from ckpteval.cli.main import app

runner = CliRunner()


def test_help_shows_options_examples_and_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for text in (
        "--config",
        "--run",
        "--batch",
        "--dry-run",
        "--task",
        "--force-squash",
        "--env-file",
        "OVERRIDES",
        "evaluate -c tiny",
        "evaluate -c sft --batch MY-CLUSTER",
        "tasks",
    ):
        assert text in result.output, text


def test_override_is_not_a_command():
    result = runner.invoke(app, ["a.b=1"])
    assert result.exit_code == 2
    assert "Cannot override 'a.b'" in result.output


def test_command_word_is_not_an_override():
    result = runner.invoke(app, ["tasks", "hellaswag"])
    assert result.exit_code == 0, result.output
    assert "hellaswag" in result.output
    assert "Cannot override" not in result.output


def test_dry_run_shows_compiled_config_and_writes_nothing(isolated_user):
    result = runner.invoke(app, ["-c", "tiny", "-d"])
    assert result.exit_code == 0, result.output
    assert "compiled config" in result.output
    assert "adlr_mmlu" in result.output
    assert "dry run" in result.output
    assert list(isolated_user.iterdir()) == []


def test_tasks_json_lists_catalog_fields():
    import json

    result = runner.invoke(app, ["tasks", "--json", "hellaswag"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    row = next(r for r in rows if r["name"] == "hellaswag")
    assert row["harness"] == "lm-evaluation-harness"
    assert row["endpoint_types"] == ["completions"]
    assert row["needs_logprobs"] is True


def test_tasks_offline_column_matches_what_the_hook_serves():
    """Every task marked as having offline data resolves to packaged data, and the mmlu_str family
    (adlr_mmlu, mmlu, mmlu_instruct*) is marked as a whole: the hook serves the harness task, not a name."""
    import json

    from ckpteval.tasks.offline_data import require_offline_data

    result = runner.invoke(app, ["tasks", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    marked = {r["name"] for r in rows if r["offline_data"]}
    assert {"adlr_mmlu", "mmlu", "hellaswag", "gsm8k", "adlr_humaneval_greedy"} <= marked
    assert "mmlu_pro" not in marked
    for row in rows:
        if row["offline_data"]:
            assert require_offline_data(row["qualified_name"]).n_available > 0


def test_console_script_exit_codes():
    """The real entry point: a bad input exits non-zero with one message and no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "ckpteval.cli", "-c", "nope", "-d"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "Unknown config 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
