"""The squash plan without a cluster: paths, build settings, the import command, the preview."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from rich.console import Console

from ckpteval.cli.squash_view import squash_plan_panel
from ckpteval.cluster.images import ImageRef, sqsh_name
from ckpteval.cluster.remote import LocalRemote
from ckpteval.cluster.squash import (
    build_settings,
    import_command,
    import_script,
    plan_squash,
    squash_applies,
)
from ckpteval.config.profiles import make_profile
from ckpteval.errors import ConfigError

PROFILE = make_profile(
    name="C",
    host="login.example.com",
    account="llm",
    partition="batch",
    time="02:00:00",
    remote_job_dir="/lustre/me/ckpteval/",
)
REFS = [
    ImageRef("deployment.image", "nvcr.io/nvidia/nemo:25.09"),
    ImageRef("evaluation.tasks[1].container", "nvcr.io/nvidia/nemo:25.09"),
    ImageRef("evaluation.tasks[0].container", "ubuntu:22.04"),
]


def test_plan_without_check_touches_nothing_and_groups_images():
    plan = plan_squash(REFS, PROFILE, check=False)
    assert plan.containers_dir == "/lustre/me/ckpteval/containers"
    assert [(i.image, i.dotpaths, i.status) for i in plan.items] == [
        ("nvcr.io/nvidia/nemo:25.09", ("deployment.image", "evaluation.tasks[1].container"), "unchecked"),
        ("ubuntu:22.04", ("evaluation.tasks[0].container",), "unchecked"),
    ]
    assert plan.items[0].path == "/lustre/me/ckpteval/containers/" + sqsh_name("nvcr.io/nvidia/nemo:25.09")
    assert plan.items[0].uri == "docker://nvcr.io#nvidia/nemo:25.09"
    assert [plan.action(i) for i in plan.items] == ["import if missing"] * 2
    assert plan.mapping == {i.image: i.path for i in plan.items}


def test_build_settings_default_to_the_run_and_can_be_set_apart():
    assert build_settings(PROFILE).srun_argv() == [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--job-name=ckpteval-squash",
        "--export=ALL",
        "--time=02:00:00",
        "--account=llm",
        "--partition=batch",
    ]
    own = make_profile(
        name="C",
        account="llm",
        partition="batch",
        build_partition="cpu",
        build_time="00:30:00",
        build_include_gpus=True,
        gpus_per_node=4,
        remote_job_dir="/x",
    )
    argv = build_settings(own).srun_argv()
    assert "--partition=cpu" in argv and "--time=00:30:00" in argv and "--gpus-per-node=4" in argv
    assert not any(a.startswith("--gpus") for a in build_settings(PROFILE).srun_argv())


def test_remote_job_dir_must_be_set_and_absolute():
    with pytest.raises(ConfigError, match="has no `remote_job_dir`"):
        plan_squash(REFS, make_profile(name="C", host="h"), check=False)
    with pytest.raises(ConfigError, match="must be an absolute path") as err:
        plan_squash(REFS, make_profile(name="C", host="h", remote_job_dir="~/ckpteval"), check=False)
    assert "not expanded" in err.value.hint


def test_bad_reference_fails_before_any_connection():
    # host is unresolvable: reaching the network would raise ClusterError, not ConfigError
    profile = make_profile(name="C", host="no-such-host.invalid", remote_job_dir="/x")
    with pytest.raises(ConfigError, match="not a container image reference"):
        plan_squash([ImageRef("deployment.image", "img:1; rm -rf ~")], profile, check=True)


def test_no_squash_for_local_runs():
    local = make_profile(name="local", executor="local")
    assert not squash_applies(local)
    assert squash_applies(PROFILE)


def test_import_command_passes_every_value_as_its_own_word():
    plan = plan_squash([ImageRef("deployment.image", "nvcr.io/nvidia/nemo:25.09")], PROFILE, check=False)
    argv = import_command(plan.items[0], plan, force=True)
    assert argv[:2] == ["bash", "-c"] and argv[3] == "ckpteval-squash"
    assert argv[4:9] == [
        plan.items[0].path,
        "docker://nvcr.io#nvidia/nemo:25.09",
        "1",
        "/lustre/me/ckpteval/containers/.enroot/cache",
        "/lustre/me/ckpteval/containers/.enroot/data",
    ]
    assert argv[9] == "srun"
    assert shlex.split(shlex.join(argv)) == argv  # survives the remote shell unchanged


def test_import_script_is_valid_bash_without_comments():
    script = import_script()
    assert not any(line.lstrip().startswith("#") for line in script.splitlines())
    assert subprocess.run(["bash", "-n", "-c", script], check=False).returncode == 0


def test_script_refuses_a_host_without_srun(tmp_path):
    plan = plan_squash(
        [ImageRef("deployment.image", "ubuntu:22.04")],
        make_profile(name="C", remote_job_dir=str(tmp_path)),
        check=False,
    )
    argv = import_command(plan.items[0], plan, force=False)
    argv[9] = "no-such-srun-binary"
    result = LocalRemote().stream(argv, on_line=lambda s, line: None, hold_stdin=True)
    assert result.returncode == 14
    assert "'no-such-srun-binary' is not available" in result.stderr
    assert not (tmp_path / "containers").exists()


def test_preview_panel_lists_images_paths_and_actions():
    plan = plan_squash(REFS, PROFILE, check=False, force=True)
    console = Console(width=200, record=True, color_system=None)
    console.print(squash_plan_panel(plan))
    text = console.export_text()
    assert "Squash plan" in text
    assert "nvcr.io/nvidia/nemo:25.09" in text and "ubuntu:22.04" in text
    assert plan.items[0].path in text
    assert "re-import" in text
    assert "account llm, partition batch, time 02:00:00, no GPUs" in text
    assert "not checked" in text and "--check" in text
    empty = Console(width=100, record=True, color_system=None)
    empty.print(squash_plan_panel(plan_squash([], PROFILE, check=False)))
    assert "No container image to squash" in empty.export_text()
