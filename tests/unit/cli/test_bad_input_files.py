"""Bad input a new user really types: files that are not what they claim, names the OS refuses, numbers
nothing can use, bytes that are not text. Each is one `error:` line plus a hint, exit 2, no traceback, and
nothing written (no results dir, no invocation record)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app

runner = CliRunner()

RANDOM_BYTES = bytes.fromhex("c6a3ff00fe17b5d2e9") * 40  # not UTF-8, not TOML, not YAML
CLUSTER = '[C]\nhost = "login.example.com"\nremote_job_dir = "/lustre/me"\n'

CASES = [
    # (id, argv, files to write {name: bytes}, expected message fragment, expected hint fragment)
    (
        "env-file-random-bytes",
        ["-c", "tiny", "-d", "--env-file", "env.toml"],
        {"env.toml": RANDOM_BYTES},
        "env.toml is not a text file (it is not UTF-8), so it cannot be an env.toml",
        "Point --env-file at your env.toml",
    ),
    (
        "env-toml-found-by-walking-up-is-random-bytes",
        ["-c", "tiny", "-d"],
        {"env.toml": RANDOM_BYTES},
        "is not a text file (it is not UTF-8)",
        "",
    ),
    ("env-file-missing", ["-c", "tiny", "-d", "--env-file", "nope.toml"], {}, "--env-file nope.toml: no such file", ""),
    (
        "env-file-is-a-directory",
        ["-c", "tiny", "-d", "--env-file", "."],
        {},
        "--env-file . is a directory",
        "--env-file ./env.toml",
    ),
    (
        "env-config-dirs-not-a-list",
        ["-c", "tiny", "-d"],
        {"env.toml": b'[cli]\nconfig_dirs = "mine"\n'},
        "config_dirs must be a list of directory paths, not 'mine'",
        'config_dirs = ["~/my-configs"]',
    ),
    (
        "profile-port-out-of-range",
        ["-c", "tiny", "--run", "C", "-d"],
        {"env.toml": (CLUSTER + "port = 99999999999\n").encode()},
        "[C]: 'port' must be between 1 and 65535, not 99999999999",
        "Fix port in that profile",
    ),
    (
        "profile-wrong-type",
        ["-c", "tiny", "--run", "C", "-d"],
        {"env.toml": (CLUSTER + 'nodes = "two"\n').encode()},
        "[C]: 'nodes' must be an integer, not 'two'",
        "",
    ),
    (
        "unknown-profile-without-env-toml",
        ["-c", "tiny", "--run", "MY-CLUSTER", "-d"],
        {},
        "Unknown profile 'MY-CLUSTER' (no env.toml was found)",
        "see env.toml.example",
    ),
    (
        "config-name-of-300-characters",
        ["-c", "a" * 300, "-d"],
        {},
        "Unknown config 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...' (300 characters",
        "Configs that exist: chat, pretrain, rl, sft, tiny",
    ),
    (
        "config-path-too-long",
        ["-c", "./" + "b" * 300 + ".yaml", "-d"],
        {},
        "does not exist",
        "Check the path",
    ),
    (
        "config-path-is-a-directory",
        ["-c", "./stages/", "-d"],
        {"stages/keep": b""},
        "Config ./stages/ is a directory, not a YAML file",
        "config_dirs",
    ),
    (
        "config-file-is-binary",
        ["-c", "./model.yaml", "-d"],
        {"model.yaml": RANDOM_BYTES},
        "model.yaml is not a text file (it is not UTF-8), so it cannot be a YAML config",
        "",
    ),
    (
        "config-file-is-a-list",
        ["-c", "./list.yaml", "-d"],
        {"list.yaml": b"- a\n- b\n"},
        "must hold a mapping",
        "",
    ),
    (
        "override-value-not-utf8",
        ["-c", "tiny", "-d", "run.model=/ckpt/\udcff\udcfe"],  # what Python makes of bytes 0xff 0xfe in argv
        {},
        "Override 'run.model=/ckpt/\\\\xff\\\\xfe' holds bytes that are not UTF-8 text",
        "UTF-8",
    ),
    (
        "port-past-65535",
        ["-c", "tiny", "-d", "deployment.port=99999999999999999999999"],
        {},
        "deployment.port must be between 1 and 65535, not 99999999999999999999999",
        "deployment.port=VALUE",
    ),
    ("negative-port", ["-c", "tiny", "-d", "deployment.port=-3"], {}, "between 1 and 65535, not -3", ""),
    ("zero-batch", ["-c", "tiny", "-d", "deployment.max_batch_size=0"], {}, "max_batch_size must be at least 1", ""),
    (
        "readiness-timeout-negative",
        ["-c", "tiny", "-d", "execution.endpoint_readiness_timeout=-1"],
        {},
        "execution.endpoint_readiness_timeout must be at least 1, not -1",
        "",
    ),
    (
        "infinite-float-for-an-int",
        ["-c", "tiny", "-d", "deployment.max_batch_size=1e400"],
        {},
        "'deployment.max_batch_size' must be an integer, not inf",
        "",
    ),
    ("list-for-an-int", ["-c", "tiny", "-d", "deployment.port=[1,2]"], {}, "must be an integer, not [1, 2]", ""),
    ("int-for-a-section", ["-c", "tiny", "-d", "evaluation=5"], {}, "'evaluation' must be a table/mapping", ""),
    (
        "a-billion-repeats",
        ["-c", "tiny", "-d", "-t", "gsm8k:99999999999"],
        {},
        "99999999999 samples per problem is more than 1000",
        "-t gsm8k:K with K at most 1000",
    ),
    ("unicode-digit-repeats", ["-c", "tiny", "-d", "-t", "gsm8k:²"], {}, "Bad task 'gsm8k:²'", "gsm8k:4"),
    (
        "relative-remote-job-dir",
        ["-c", "tiny", "--run", "C", "-d"],
        {"env.toml": b'[C]\nhost = "h"\nremote_job_dir = "~/ckpteval"\n'},
        "Profile [C]: remote_job_dir must be an absolute path on the cluster, not '~/ckpteval'",
        "~ and $HOME are not expanded",
    ),
    (
        "no-remote-job-dir",
        ["-c", "tiny", "--run", "C", "-d"],
        {"env.toml": b'[C]\nhost = "h"\n'},
        "Profile [C] has no `remote_job_dir`, where jobs and results go on the cluster",
        'remote_job_dir = "/lustre/.../ckpteval"',
    ),
    (
        "relative-output-dir-on-a-cluster",
        ["-c", "tiny", "--run", "C", "-d", "execution.output_dir=results"],
        {"env.toml": CLUSTER.encode()},
        "execution.output_dir must be an absolute path on the cluster, not 'results'",
        "",
    ),
]


@pytest.mark.parametrize(("argv", "files", "message", "hint"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(isolated_user: Path, argv, files, message, hint):
    for name, data in files.items():
        path = isolated_user / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    before = sorted(str(p.relative_to(isolated_user)) for p in isolated_user.rglob("*"))
    result = runner.invoke(app, argv)
    output = result.output
    assert result.exit_code == 2, output
    assert "Traceback" not in output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = output.strip().splitlines()
    assert lines[0].startswith("error: ") and message in lines[0], output  # the message is one line
    assert hint in output, output
    assert sorted(str(p.relative_to(isolated_user)) for p in isolated_user.rglob("*")) == before  # nothing written
    assert not (Path(os.environ["XDG_STATE_HOME"]) / "ckpteval").exists()


def test_squash_checks_remote_job_dir_before_connecting(isolated_user: Path):
    # the host does not resolve: were it contacted, the error would be about the host
    (isolated_user / "env.toml").write_text('[C]\nhost = "no-such-host.invalid"\nremote_job_dir = "rel/dir"\n')
    result = runner.invoke(app, ["squash", "nvcr.io/nvidia/nemo:25.09", "--run", "C"])
    assert result.exit_code == 2, result.output
    assert "remote_job_dir must be an absolute path on the cluster, not 'rel/dir'" in result.output


def test_serve_delegate_refuses_a_port_past_65535_before_binding(isolated_user: Path):
    result = runner.invoke(app, ["serve-delegate", "--port", "99999999"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--port'" in result.output and "65535" in result.output
    assert "Traceback" not in result.output and "OverflowError" not in result.output
