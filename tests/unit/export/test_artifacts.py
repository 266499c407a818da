"""`${art:model,path}` for W&B model artifacts.

What runs for real here: reference parsing; the metadata/reference rules on real `wandb.Artifact`
objects (built in memory, with real `file://` references to real directories); the wandb client
against a closed port and against a real HTTP server that rejects the key; the not-logged-in and
no-path errors at compile time, through the CLI. What cannot run here: a lookup that succeeds on a
W&B server (none is reachable). For that path the one network function, `fetch_artifact`, is
replaced by one returning a real in-memory artifact, and everything around it runs.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.config.resolvers import looks_like_artifact
from ckpteval.errors import ConfigError
from ckpteval.export import artifacts
from ckpteval.export.artifacts import (
    ArtifactRef,
    artifact_checkpoint_path,
    checkpoint_path_from,
    fetch_artifact,
    parse_artifact_ref,
)
from ckpteval.export.credentials import WandbKey
from tests.support.wandb_login import fake_key, write_netrc


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("my-model:latest", ArtifactRef(entity="team", project="evals", name="my-model", alias="latest")),
        ("my-model:v3", ArtifactRef(entity="team", project="evals", name="my-model", alias="v3")),
        ("other/my-model:best", ArtifactRef(entity="team", project="other", name="my-model", alias="best")),
        ("org/proj/nano3-rl-model:v12", ArtifactRef(entity="org", project="proj", name="nano3-rl-model", alias="v12")),
    ],
)
def test_references_take_missing_parts_from_the_settings(value: str, expected: ArtifactRef):
    assert looks_like_artifact(value)
    assert parse_artifact_ref(value, entity="team", project="evals") == expected


def test_paths_are_not_artifacts():
    for path in ("/lustre/ckpt", "./ckpt", "~/ckpt", "ckpt", "/data/run:3/ckpt"):
        assert not looks_like_artifact(path), path


def test_a_reference_without_a_project_says_where_to_set_one():
    with pytest.raises(ConfigError, match="no W&B project") as info:
        parse_artifact_ref("my-model:latest", entity="team", project=None)
    assert "[wandb]" in (info.value.hint or "")
    assert parse_artifact_ref("p/m:latest", entity=None, project=None).qualified == "p/m:latest"


@pytest.mark.parametrize("value", ["a/b/c/d:latest", "my model:latest", "m:", ":v1"])
def test_malformed_references_are_config_errors(value: str):
    with pytest.raises(ConfigError, match="neither a path nor a W&B artifact"):
        parse_artifact_ref(value, entity="e", project="p")


def _model(**metadata: Any) -> Any:
    import wandb

    return wandb.Artifact("model", type="model", metadata=metadata or None)


def _checkpoint(root: Path) -> Path:
    (root / "iter_0000100").mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text("100\n")
    for name in (".metadata", "common.pt", "__0_0.distcp"):  # a torch_dist checkpoint's files
        (root / "iter_0000100" / name).write_bytes(b"\0" * 16)
    return root


def test_metadata_absolute_path_wins():
    assert artifact_checkpoint_path(_model(absolute_path="/lustre/ckpt", path="/x"), label="m") == (
        "/lustre/ckpt",
        "metadata absolute_path",
    )


def test_a_legacy_iteration_path_becomes_its_checkpoint_dir():
    path, _ = artifact_checkpoint_path(_model(absolute_path="/lustre/ckpt/iter_0000100/"), label="m")
    assert path == "/lustre/ckpt"


def test_metadata_path_and_file_uris():
    assert artifact_checkpoint_path(_model(path="file:///lustre/my%20ckpt"), label="m") == (
        "/lustre/my ckpt",
        "metadata path",
    )


def test_a_relative_metadata_path_is_refused():
    with pytest.raises(ConfigError, match="not an absolute path"):
        artifact_checkpoint_path(_model(path="ckpt/iter_1"), label="team/p/model:v1")


def test_a_file_reference_to_a_checkpoint_dir(tmp_path: Path):
    root = _checkpoint(tmp_path / "ckpt")
    for kwargs in ({}, {"checksum": False}, {"name": "checkpoint"}):
        art = _model()
        art.add_reference(f"file://{root}", **kwargs)
        assert artifact_checkpoint_path(art, label="m") == (str(root), "file:// reference"), kwargs


def test_a_file_reference_to_one_iteration(tmp_path: Path):
    root = _checkpoint(tmp_path / "ckpt")
    art = _model()
    art.add_reference(f"file://{root}/iter_0000100")
    assert artifact_checkpoint_path(art, label="m")[0] == str(root)


def test_a_file_reference_to_one_file(tmp_path: Path):
    archive = tmp_path / "model.nemo"
    archive.write_bytes(b"nemo")
    art = _model()
    art.add_reference(f"file://{archive}")
    assert artifact_checkpoint_path(art, label="m")[0] == str(archive)


def test_references_with_nothing_in_common_are_refused():
    refs = [("a/x", "file:///a/x"), ("b/y", "file:///b/y")]
    with pytest.raises(ConfigError, match="no directory in common"):
        checkpoint_path_from({}, refs, label="m")


def test_an_artifact_without_a_path_says_how_to_record_one(tmp_path: Path):
    art = _model(step=100)
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"w")
    art.add_file(str(weights))  # uploaded files, no location on a cluster
    with pytest.raises(ConfigError, match="does not say where its checkpoint is") as info:
        artifact_checkpoint_path(art, label="team/p/model:v1")
    assert "absolute_path" in (info.value.hint or "") and "add_reference" in (info.value.hint or "")


def test_non_file_references_do_not_count():
    with pytest.raises(ConfigError, match="does not say where"):
        checkpoint_path_from({}, [("w", "s3://bucket/ckpt/w")], label="m")


def test_an_unreachable_server_fails_in_seconds_with_a_hint():
    start = time.monotonic()
    with pytest.raises(ConfigError, match="Cannot resolve W&B artifact team/p/m:latest") as info:
        fetch_artifact(
            ArtifactRef("team", "p", "m", "latest"),
            key=WandbKey(value=fake_key("u"), origin="env", source="WANDB_API_KEY"),
            base_url="http://127.0.0.1:9",
            timeout=5,
        )
    assert time.monotonic() - start < 60
    assert "reachable" in (info.value.hint or "")
    assert fake_key("u") not in str(info.value)


class _Rejecting(http.server.BaseHTTPRequestHandler):
    """A server that knows no key: every request is 401, as W&B answers an unknown key."""

    def _reject(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"errors":[{"message":"user is not logged in"}]}')

    do_POST = do_GET = _reject

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def rejecting_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Rejecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_rejected_key_says_relogin(rejecting_server: str):
    with pytest.raises(ConfigError) as info:
        fetch_artifact(
            ArtifactRef("team", "p", "m", "latest"),
            key=WandbKey(value=fake_key("x"), origin="env", source="WANDB_API_KEY"),
            base_url=rejecting_server,
            timeout=10,
        )
    assert "wandb login --relogin" in (info.value.hint or "")


runner = CliRunner()


def test_not_logged_in_is_one_clear_line_before_anything_runs(isolated_user: Path):
    result = runner.invoke(
        app,
        ["-c", "sft", "--dry-run", "run.model=my-model:latest", "run.wandb.project=evals"],
    )
    assert result.exit_code == 2, result.output
    assert "is a W&B artifact, but no W&B login was found" in result.output
    assert "wandb login" in result.output
    assert "Traceback" not in result.output
    assert list(isolated_user.iterdir()) == []


@pytest.fixture
def artifact_server(monkeypatch: pytest.MonkeyPatch, wandb_home: Path) -> list[tuple[str, Any]]:
    """W&B as far as this machine can have it: a login, and `fetch_artifact` answering with real
    in-memory artifacts (the lookup itself needs wandb.ai). Returns the calls made."""
    write_netrc(wandb_home, fake_key("a"))
    calls: list[tuple[str, Any]] = []

    import wandb

    class Fetched(wandb.Artifact):
        """An artifact as the server returns it: it knows the version its alias points at."""

        @property
        def qualified_name(self) -> str:
            return "team/evals/my-model:v7"

    def fetch(ref: ArtifactRef, *, key: WandbKey, base_url: str | None, timeout: float) -> Any:
        calls.append((ref.qualified, key.origin))
        return Fetched("my-model", type="model", metadata={"absolute_path": "/lustre/team/ckpts/sft-run7/iter_0002000"})

    monkeypatch.setattr(artifacts, "fetch_artifact", fetch)
    return calls


def _slurm_env_toml(directory: Path) -> Path:
    path = directory / "env.toml"
    path.write_text(
        '[wandb]\nentity = "team"\nproject = "evals"\n\n'
        '[CLUSTER]\nexecutor = "slurm"\nhost = "login.example"\naccount = "acct"\n'
        'remote_job_dir = "/lustre/me/ckpteval"\ncontainer_image = "nvcr.io/nvidia/nemo:25.11"\n'
    )
    return path


def test_a_resolved_artifact_is_the_checkpoint_path_and_the_dry_run_says_so(
    artifact_server: list[tuple[str, Any]],
    isolated_user: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    from ckpteval import CompileRequest, compile_config
    from ckpteval.cli.preview import render_preview
    from ckpteval.notices import show_notices

    show_notices()  # as the CLI does: the library's notices as lines on stderr

    env = _slurm_env_toml(isolated_user)
    compiled = compile_config(
        CompileRequest(
            configs=("sft",), profile="CLUSTER", mode="batch", env_file=env, overrides=("run.model=my-model:latest",)
        )
    )
    deployment = compiled.data["deployment"]
    assert deployment["checkpoint_path"] == "/lustre/team/ckpts/sft-run7"
    assert deployment["tokenizer"] == "from-checkpoint"  # Export-Deploy's clients: <checkpoint_path>/tokenizer
    # looked up once although the path is interpolated in several places, with the [wandb] defaults
    assert artifact_server == [("team/evals/my-model:latest", "login")]
    note = "run.model team/evals/my-model:latest -> /lustre/team/ckpts/sft-run7 (W&B artifact team/evals/my-model:v7"
    assert any(n.startswith(note) for n in compiled.notes), compiled.notes
    monkeypatch.setenv("COLUMNS", "300")
    render_preview(compiled, dry_run=True)
    out = capsys.readouterr()
    assert note in out.out
    assert "team/evals/my-model:v7" in out.out
    assert "Detected W&B login" in out.err
    assert fake_key("a") not in out.out + out.err


def test_config_alone_refuses_an_artifact_reference_it_has_no_resolver_for(isolated_user: Path):
    """config/ sits below export/: W&B resolution is passed in (ckpteval.compile_config does), never imported."""
    from ckpteval.config.compile import compile_config
    from ckpteval.config.compose import CompileRequest

    env = _slurm_env_toml(isolated_user)
    request = CompileRequest(
        configs=("sft",), profile="CLUSTER", mode="batch", env_file=env, overrides=("run.model=my-model:latest",)
    )
    with pytest.raises(ConfigError, match="names a model artifact"):
        compile_config(request)
