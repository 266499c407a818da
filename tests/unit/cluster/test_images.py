"""Finding, naming and rewriting container image references in a resolved config."""

from __future__ import annotations

import pytest

from ckpteval.cluster.images import (
    ImageRef,
    collect_images,
    enroot_uri,
    is_squashable,
    rewrite_images,
    sqsh_name,
    validate_image,
)
from ckpteval.errors import ConfigError

CONFIG = {
    "deployment": {"type": "megatron", "image": "nvcr.io/nvidia/nemo:25.09"},
    "evaluation": {
        "tasks": [
            {"name": "adlr_mmlu", "container": "nvcr.io/nvidia/eval-factory/lm-evaluation-harness:25.10"},
            "hellaswag",  # a bare task name has no container of its own
            {"name": "gsm8k", "container": "/lustre/images/lm-eval.sqsh"},
            {"name": "humaneval", "container": "nvcr.io/nvidia/nemo:25.09"},
            {"name": "x", "container": None},
        ]
    },
    "execution": {"proxy": {"image": "nginx:1.27"}},
}


def test_collect_finds_registry_references_in_config_order():
    assert collect_images(CONFIG) == [
        ImageRef("deployment.image", "nvcr.io/nvidia/nemo:25.09"),
        ImageRef("evaluation.tasks[0].container", "nvcr.io/nvidia/eval-factory/lm-evaluation-harness:25.10"),
        ImageRef("evaluation.tasks[3].container", "nvcr.io/nvidia/nemo:25.09"),
    ]


def test_collect_tolerates_missing_sections():
    assert collect_images({}) == []
    assert collect_images({"deployment": {"image": None}, "evaluation": {"tasks": None}}) == []
    assert collect_images({"deployment": {"image": "relative/path.sqsh"}}) == []


def test_rewrite_replaces_every_use_and_leaves_the_input_alone():
    mapping = {"nvcr.io/nvidia/nemo:25.09": "/rjd/containers/nemo.sqsh", "nginx:1.27": "/rjd/containers/nginx.sqsh"}
    new = rewrite_images(CONFIG, mapping)
    assert new["deployment"]["image"] == "/rjd/containers/nemo.sqsh"
    assert new["evaluation"]["tasks"][3]["container"] == "/rjd/containers/nemo.sqsh"
    assert new["evaluation"]["tasks"][0]["container"].startswith("nvcr.io/")  # not in the mapping
    assert new["evaluation"]["tasks"][2]["container"] == "/lustre/images/lm-eval.sqsh"
    assert new["evaluation"]["tasks"][1] == "hellaswag"
    assert new["execution"]["proxy"]["image"] == "nginx:1.27"  # not a place ckpteval runs images from
    assert CONFIG["deployment"]["image"] == "nvcr.io/nvidia/nemo:25.09"
    assert collect_images(new) == [
        ImageRef("evaluation.tasks[0].container", "nvcr.io/nvidia/eval-factory/lm-evaluation-harness:25.10")
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
