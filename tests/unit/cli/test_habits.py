"""Habits from nel, lm-eval and inspect: each mistake is one `error:` line that says what to type, exit 2,
no traceback and no framework box; the habits that map cleanly (`-o`, `--limit`, `--model`, `-t a,b`,
`help`) work."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app

runner = CliRunner()

MISTAKES = [
    # (id, argv, what the one error line says)
    ("typo", ["stauts"], "Did you mean `evaluate status`?"),
    ("typo-in-command", ["resmue", "abc"], "Did you mean `evaluate resume`?"),
    ("nel-run", ["run", "-c", "tiny"], "use `evaluate -c CONFIG [--run PROFILE]`"),
    ("nel-ls-tasks", ["ls", "tasks"], "use `evaluate tasks`"),
    ("nel-ls-runs", ["ls", "runs"], "use `evaluate status`"),
    ("kill", ["kill", "abc123"], "use `evaluate cancel ID`"),
    ("bare-word", ["frobnicate"], "is neither a command nor an override"),
    ("lm-eval-model-args", ["--model_args", "pretrained=x"], "the checkpoint is --model PATH (run.model=PATH)"),
    ("lm-eval-batch-size", ["-c", "tiny", "--batch_size", "8"], "deployment.max_batch_size=8"),
    ("lm-eval-batch-size-dash", ["-c", "tiny", "--batch-size=8"], "params.parallelism=8"),
    ("lm-eval-device", ["-c", "tiny", "--device", "cuda:0"], "pass deployment.device=cuda"),
    ("lm-eval-fewshot", ["-c", "tiny", "--num_fewshot", "5"], "is --num-fewshot 5 (++evaluation.nemo_evaluator"),
    ("version-word", ["version"], "Did you mean `evaluate --version`?"),
    ("version-word-after-config", ["-c", "tiny", "version"], "Did you mean `evaluate --version`?"),
    ("empty-task", ["-c", "tiny", "-d", "-t", ""], "-t '' names no task."),
    ("empty-task-list", ["-c", "tiny", "-d", "-t", " , "], "names no task."),
    ("unknown-flag-close", ["--lmit", "3"], "No such option: --lmit (Possible options: --limit)."),
    ("subcommand-flag", ["status", "--bogus"], "No such option: --bogus."),
    ("subcommand-value", ["status", "--limit", "lots"], "Invalid value for '--limit'"),
    ("missing-value", ["-c", "tiny", "--run"], "Option '--run' requires an argument."),
    ("close-key", ["-c", "tiny", "-d", "deployment.prot=9000"], "Cannot override 'deployment.prot'"),
    ("deeper-key", ["-c", "tiny", "-d", "evaluation.limit_samples=3"], "Cannot override 'evaluation.limit_samples'"),
    ("group-option", ["-c", "tiny", "-d", "deployment=vlm"], "Unknown deployment 'vlm'."),
    ("bad-limit", ["-c", "tiny", "-d", "--limit", "0"], "--limit takes a number of documents per task (5)"),
    ("word-limit", ["-c", "tiny", "-d", "--limit", "lots"], "a fraction of each task's documents (0.1), or none"),
]


def _invoke(argv: list[str]):
    return runner.invoke(app, argv, terminal_width=80)


def _assert_one_line(result, expected: str) -> list[str]:
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, result.output
    assert expected in errors[0], result.output
    assert "Traceback" not in result.output and "╭" not in result.output and "Usage:" not in result.output
    assert len(lines) <= 2, result.output  # the error line, and at most one line of hint
    return lines


@pytest.mark.parametrize(("argv", "expected"), [c[1:] for c in MISTAKES], ids=[c[0] for c in MISTAKES])
def test_mistake_is_one_line_exit_2(isolated_user, argv, expected):
    _assert_one_line(_invoke(argv), expected)


def test_override_hint_suggests_the_close_key_first(isolated_user):
    lines = _assert_one_line(_invoke(["-c", "tiny", "-d", "deployment.prot=9000"]), "no such key")
    assert lines[1] == "Did you mean deployment.port=9000?"


def test_override_hint_corrects_a_misspelled_section_rather_than_offering_plus(isolated_user):
    lines = _assert_one_line(_invoke(["-c", "tiny", "-d", "exection.output_dir=/tmp/x"]), "no such key")
    assert lines[1] == "Did you mean execution.output_dir=/tmp/x?"


def test_hinted_overrides_are_accepted(isolated_user):
    # what the hints above tell the user to type compiles
    argv = ["-c", "tiny", "-d", "deployment.max_batch_size=8", "deployment.device=cuda", "execution.output_dir=/tmp/x"]
    argv += ["evaluation.nemo_evaluator_config.config.params.parallelism=8"]
    argv += ["+evaluation.nemo_evaluator_config.config.params.extra.num_fewshot=5"]
    result = _invoke(argv)
    assert result.exit_code == 0, result.output
    assert "num_fewshot: 5" in result.output


def test_override_hint_names_the_real_path_of_a_deeper_key(isolated_user):
    lines = _assert_one_line(_invoke(["-c", "tiny", "-d", "evaluation.limit_samples=3"]), "no such key")
    assert "evaluation.nemo_evaluator_config.config.params.limit_samples=3" in lines[1]
    assert "+evaluation" not in lines[1]


def test_override_hint_offers_plus_only_for_a_new_key(isolated_user):
    lines = _assert_one_line(_invoke(["-c", "tiny", "-d", "evaluation.zzz=1"]), "no such key")
    assert "+evaluation.zzz=1" in lines[1]


def test_override_hint_reads_the_config_the_group_selections_make(isolated_user):
    # hf_model_handle exists under deployment=vllm only; another bad override beside it does not hide it
    argv = ["-c", "tiny", "-d", "deployment=vllm", "deployment.hf_model_handl=x", "evaluation.zzz=1"]
    lines = _assert_one_line(_invoke(argv), "no such key")
    assert lines[1] == "Did you mean deployment.hf_model_handle=x?"


def test_group_hint_lists_the_options(isolated_user):
    lines = _assert_one_line(_invoke(["-c", "tiny", "-d", "deployment=vlm"]), "Unknown deployment")
    assert lines[1].startswith("Did you mean deployment=vllm? Options of deployment: ")
    assert "megatron" in lines[1]


def test_help_word_shows_help(isolated_user):
    root = _invoke(["help"])
    assert root.exit_code == 0 and "Commands" in root.output and "--dry-run" in root.output
    status = _invoke(["help", "status"])
    assert status.exit_code == 0 and "Usage: evaluate status" in status.output


def test_dash_o_is_an_override(isolated_user):
    # the override reaches the config: its key is checked like a trailing one
    lines = _assert_one_line(_invoke(["-c", "tiny", "-d", "-o", "deployment.prot=9000"]), "deployment.prot")
    assert lines[1] == "Did you mean deployment.port=9000?"


def test_model_flag_is_run_model(isolated_user):
    result = _invoke(["-c", "tiny", "-d", "--model", "/nonexistent/ckpt,v2"])
    _assert_one_line(result, "Checkpoint /nonexistent/ckpt,v2 does not exist")


def test_limit_and_comma_tasks_reach_the_compiled_config(isolated_user):
    result = runner.invoke(
        app,
        ["-c", "tiny", "-d", "--limit", "3", "-t", "adlr_mmlu,hellaswag", "-o", "evaluation.max_parallel_tasks=1"],
        terminal_width=140,
    )
    assert result.exit_code == 0, result.output
    assert "limit_samples: 3" in result.output
    assert "max_parallel_tasks: 1" in result.output
    summary = next(ln for ln in result.output.splitlines() if "tasks " in ln and "adlr_mmlu" in ln)
    assert "adlr_mmlu: 171 documents" in summary and "│             hellaswag: 3 documents" in result.output


@pytest.mark.parametrize(
    ("limit", "compiled", "documents"),
    [
        ("5", "limit_samples: 5", "adlr_mmlu: 285 documents (5 per subtask, 57 subtasks)"),
        ("0.1", "limit_samples: 0.1", "adlr_mmlu: 1,397 documents (57 subtasks)"),
        ("none", "limit_samples: null", "adlr_mmlu: 13,757 documents (57 subtasks)"),
    ],
)
def test_limit_takes_what_lm_eval_takes_and_the_dry_run_says_the_documents(isolated_user, limit, compiled, documents):
    result = runner.invoke(app, ["-c", "tiny", "-d", "--limit", limit], terminal_width=120, env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert compiled in result.output
    assert documents in result.output  # before the run: lm-eval applies the limit per MMLU subject


def test_the_help_names_no_limit_and_the_few_shot_key(isolated_user):
    result = runner.invoke(app, ["-c", "x", "--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--limit none" in result.output and "--num-fewshot" in result.output
    assert "params.extra.num_fewshot" in result.output


@pytest.mark.parametrize("width", [80, 140])
def test_num_fewshot_sets_the_few_shot_key_and_its_example_fits(isolated_user, width):
    result = runner.invoke(app, ["-c", "tiny", "-t", "adlr_mmlu", "-d", "--num-fewshot", "0"], terminal_width=width)
    assert result.exit_code == 0, result.output
    assert "num_fewshot: 0" in result.output
    shown = runner.invoke(app, ["--help"], terminal_width=width, env={"COLUMNS": str(width)})
    example = next(line for line in shown.output.splitlines() if "--num-fewshot 0" in line)
    assert "# zero-shot (few-shot: N)" in example and len(example.rstrip()) <= width, example
    refused = runner.invoke(app, ["-c", "tiny", "-d", "--num-fewshot", "-1"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output
