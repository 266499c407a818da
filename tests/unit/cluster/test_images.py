"""The images a job plan runs in: finding, checking, naming and swapping in their .sqsh files."""

from __future__ import annotations

import pytest

from ckpteval.cluster.images import ImageRef, enroot_uri, is_squashable, sqsh_name, validate_image
from ckpteval.cluster.submission import job_images, with_images
from ckpteval.errors import ConfigError
from ckpteval.job.plan import DeploymentPlan, JobPlan, Step, TaskPlan, TaskRun
from ckpteval.tasks.repeats import run_layouts


def _step(image: str | None) -> Step:
    return Step(command="true", image=image)


def _task(i: int, image: str | None, *, repeats: int = 0) -> TaskPlan:
    layouts = run_layouts(repeats)
    runs = tuple(TaskRun(run_config={}, step=_step(image), layout=layout) for layout in layouts)
    return TaskPlan(
        name=f"t{i}", dir_name=f"t{i}", runs=runs, endpoint_url="http://127.0.0.1:8000/v1/completions", repeats=repeats
    )


# what build_plan makes for a Slurm job: the deployment's image and each task's container on its steps
PLAN = JobPlan(
    invocation="inv",
    job_dir="/rjd/inv",
    deployment=DeploymentPlan(
        kind="megatron/export-deploy", step=_step("nvcr.io/nvidia/nemo:25.09"), health_url=None, readiness_timeout=60
    ),
    tasks=(
        _task(0, "nvcr.io/nvidia/eval-factory/lm-evaluation-harness:25.10", repeats=2),
        _task(1, None),  # no container of its own
        _task(2, "/lustre/images/lm-eval.sqsh"),  # a file on the cluster: used as it is
        _task(3, "nvcr.io/nvidia/nemo:25.09"),
    ),
)


def test_job_images_lists_the_registry_references_of_the_steps_in_order():
    assert job_images(PLAN) == [
        ImageRef("deployment.image", "nvcr.io/nvidia/nemo:25.09"),
        ImageRef("evaluation.tasks[0].container (t0)", "nvcr.io/nvidia/eval-factory/lm-evaluation-harness:25.10"),
        ImageRef("evaluation.tasks[3].container (t3)", "nvcr.io/nvidia/nemo:25.09"),
    ]


def test_a_plan_without_images_has_nothing_to_squash():
    bare = JobPlan(
        invocation="inv",
        job_dir="/j",
        deployment=DeploymentPlan(kind="none", step=None, health_url=None, readiness_timeout=1),
        tasks=(_task(0, None),),
    )
    assert job_images(bare) == []


def test_with_images_swaps_every_step_and_leaves_the_plan_alone():
    mapping = {"nvcr.io/nvidia/nemo:25.09": "/rjd/containers/nemo.sqsh"}
    new = with_images(PLAN, mapping)
    assert new.deployment.step is not None and new.deployment.step.image == "/rjd/containers/nemo.sqsh"
    assert [r.step.image for r in new.tasks[3].runs] == ["/rjd/containers/nemo.sqsh"]
    assert {r.step.image for r in new.tasks[0].runs} == {"nvcr.io/nvidia/eval-factory/lm-evaluation-harness:25.10"}
    assert new.tasks[1].runs[0].step.image is None
    assert new.tasks[2].runs[0].step.image == "/lustre/images/lm-eval.sqsh"
    assert PLAN.deployment.step is not None and PLAN.deployment.step.image == "nvcr.io/nvidia/nemo:25.09"
    assert job_images(new) == [
        ImageRef("evaluation.tasks[0].container (t0)", "nvcr.io/nvidia/eval-factory/lm-evaluation-harness:25.10")
    ]


@pytest.mark.parametrize(
    ("image", "uri"),
    [
        ("nvcr.io/nvidia/nemo:25.09", "docker://nvcr.io#nvidia/nemo:25.09"),
        ("localhost:5000/me/img:1", "docker://localhost:5000#me/img:1"),
        ("localhost/img", "docker://localhost#img"),
        ("ubuntu:22.04", "docker://ubuntu:22.04"),
        ("library/ubuntu", "docker://library/ubuntu"),
        ("nvcr.io#nvidia/nemo:25.09", "docker://nvcr.io#nvidia/nemo:25.09"),
        ("user@nvcr.io#nvidia/nemo:25.09", "docker://user@nvcr.io#nvidia/nemo:25.09"),
        ("docker://ubuntu", "docker://ubuntu"),
        ("dockerd://myimage:dev", "dockerd://myimage:dev"),
    ],
)
def test_enroot_uri_separates_the_registry_like_docker_does(image, uri):
    assert enroot_uri(image) == uri


def test_sqsh_name_is_readable_stable_and_unambiguous():
    name = sqsh_name("nvcr.io/nvidia/nemo:25.09")
    assert name.startswith("nvcr.io+nvidia+nemo+25.09-") and name.endswith(".sqsh")
    assert sqsh_name("docker://nvcr.io#nvidia/nemo:25.09") == name  # same image, same file
    # the readable parts collide; the hash keeps them apart
    assert sqsh_name("host:5000/img:tag") != sqsh_name("host/5000/img:tag")
    long = sqsh_name("nvcr.io/" + "a" * 300 + ":1")
    assert len(long) < 130
    assert "/" not in sqsh_name("a/b/c:d") and not sqsh_name(".hidden/x").startswith(".")


@pytest.mark.parametrize(
    "image",
    ["nvcr.io/nvidia/nemo:25.09", "ubuntu", "img@sha256:" + "a" * 64, "user@nvcr.io#nvidia/nemo:1", "docker://x/y:z"],
)
def test_valid_references_pass(image):
    validate_image(image)


@pytest.mark.parametrize(
    ("image", "shown"),
    [
        ("repo/img:1;touch /tmp/x", "';'"),
        ("repo/$(id)", "'$'"),
        ("a b", "' '"),
        ("it's", '"\'"'),
        ('x"y', "'\"'"),
        ("`id`", "'`'"),
        ("", "its first character"),
        ("-rf", "its first character"),
    ],
)
def test_invalid_references_are_refused_with_the_offending_characters(image, shown):
    with pytest.raises(ConfigError) as err:
        validate_image(image, where="deployment.image")
    assert err.value.message.startswith("deployment.image: ")
    assert shown in err.value.message
    assert ".sqsh" in err.value.hint


def test_sqsh_files_and_absolute_paths_are_used_as_they_are():
    assert not is_squashable("/lustre/x.sqsh")
    assert not is_squashable("/lustre/rootfs")
    assert not is_squashable("images/x.sqsh")
    assert is_squashable("nvcr.io/nvidia/nemo:25.09")
