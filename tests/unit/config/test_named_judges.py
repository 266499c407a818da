"""Named judges in env.toml: a `[judges.NAME]` set once, selected by `judge=NAME` or by a profile's
`judge = "NAME"`, checked like the other profile fields (dotted path, close names), its key only ever the
NAME of a variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckpteval.config.compile import compile_config
from ckpteval.config.compose import CompileRequest
from ckpteval.config.profiles import load_env_file
from ckpteval.errors import ConfigError

JUDGES = """
[judges.llama-70b]
type = "api"
url = "https://judge.example/v1"
model_id = "meta/llama-3.1-70b-instruct"
api_key_name = "MY_JUDGE_KEY"
max_error_rate = 0.1

[judges.local-judge]
type = "api"
url = "http://127.0.0.1:9000/v1"
model_id = "judge-8b"

[laptop]
executor = "local"
tunnel = "local"
judge = "llama-70b"
"""


def _compile(*overrides: str, profile: str | None = None):
    request = CompileRequest(
        configs=("tiny",), tasks=("mtbench",), overrides=overrides, profile=profile, mode="run" if profile else "local"
    )
    return compile_config(request)


def test_judge_name_selects_an_env_toml_judge(write_env, monkeypatch: pytest.MonkeyPatch) -> None:
    write_env(JUDGES)
    monkeypatch.setenv("MY_JUDGE_KEY", "s3cret")
    judge = _compile("judge=llama-70b").config.judge
    assert (judge.type, judge.url, judge.model_id, judge.api_key_name, judge.max_error_rate) == (
        "api",
        "https://judge.example/v1",
        "meta/llama-3.1-70b-instruct",
        "MY_JUDGE_KEY",
        0.1,
    )
    # a key of it can still be set on the command line, as for a packaged judge
    assert _compile("judge=local-judge", "judge.model_id=judge-8b-v2").config.judge.model_id == "judge-8b-v2"


def test_a_profile_judge_is_the_default_and_the_command_line_wins(write_env, monkeypatch: pytest.MonkeyPatch) -> None:
    write_env(JUDGES)
    monkeypatch.setenv("MY_JUDGE_KEY", "s3cret")
    assert _compile(profile="laptop").config.judge.model_id == "meta/llama-3.1-70b-instruct"
    assert _compile("judge=local-judge", profile="laptop").config.judge.model_id == "judge-8b"
    assert _compile("judge=self", profile="laptop").config.judge.type == "self"
    # the built-in local profile (no --run) has no judge of its own: a judged task is refused, naming the choices
    with pytest.raises(ConfigError, match=r"no judge is set: .*judge=NAME \(a \[judges.NAME\] of env.toml\)"):
        _compile()


def test_an_unknown_judge_name_is_answered_with_the_close_ones(write_env) -> None:
    write_env(JUDGES)
    with pytest.raises(ConfigError) as err:
        _compile("judge=llama70b")
    text = f"{err.value} {err.value.hint}"
    assert "Unknown judge 'llama70b'" in text and "llama-70b" in text


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('type = "api"\nurl = "http://j/v1"\nmodle_id = "m"', r"unknown key 'judges.j.modle_id'.*model_id"),
        ('type = "api"\nurl = "http://j/v1"', r"'judges.j.model_id' is required"),
        ('type = "apy"\nurl = "http://j/v1"\nmodel_id = "m"', r"'judges.j.type' is 'apy'.*'api'"),
        ('type = "api"\nurl = "http://j/v1"\nmodel_id = "m"\nmax_error_rate = "high"', r"'judges.j.max_error_rate'"),
    ],
)
def test_a_bad_judge_table_is_refused_with_its_dotted_path(write_env, table: str, expected: str) -> None:
    write_env(f"[judges.j]\n{table}\n")
    with pytest.raises(ConfigError) as err:
        load_env_file()
    assert re.search(expected, f"{err.value} {err.value.hint}", re.S), f"{err.value} {err.value.hint}"


def test_a_key_pasted_where_its_variable_name_belongs_is_refused_without_repeating_it(write_env) -> None:
    key = "nvapi-Zx9QwErTy0123456789abcdef"
    write_env(f'[judges.j]\ntype = "api"\nurl = "http://j/v1"\nmodel_id = "m"\napi_key_name = "{key}"\n')
    with pytest.raises(ConfigError) as err:
        load_env_file()
    text = f"{err.value} {err.value.hint}"
    assert "'judges.j.api_key_name' must be the NAME of an environment variable" in text
    assert key not in text


def test_a_profile_naming_no_judge_and_a_judge_taking_a_packaged_name_are_refused(write_env) -> None:
    write_env(JUDGES.replace('judge = "llama-70b"', 'judge = "llama-7b"'))
    with pytest.raises(ConfigError) as err:
        load_env_file().profile("laptop")
    assert "[laptop]: judge = 'llama-7b' names no [judges.llama-7b] table" in str(err.value)
    assert "llama-70b" in str(err.value)  # the close name
    write_env('[judges.api]\ntype = "api"\nurl = "http://j/v1"\nmodel_id = "m"\n')
    with pytest.raises(ConfigError, match=r"\[judges.api\] takes the name of the packaged judge=api"):
        load_env_file()


def test_env_toml_example_names_a_judge_that_loads(isolated_user: Path) -> None:
    example = Path(__file__).resolve().parents[3] / "env.toml.example"
    env = load_env_file(example)
    assert env.judges, "env.toml.example shows a [judges.NAME]"
    for name in env.judges:
        assert env.judges[name]["type"] == "api"
