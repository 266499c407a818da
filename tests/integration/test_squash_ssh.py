"""Auto-squash against the real sshd, Slurm and the enroot stand-in: cache, lock, atomicity, quoting, faults."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from ckpteval.cluster.connect import connect_remote
from ckpteval.cluster.images import ImageRef, sqsh_name
from ckpteval.cluster.remote import LocalRemote
from ckpteval.cluster.squash import (
    SquashEvent,
    ensure_squashed,
    import_image,
    plan_squash,
)
from ckpteval.cluster.submission import job_images, with_images
from ckpteval.errors import ClusterError, ConfigError
from ckpteval.job.plan import DeploymentPlan, JobPlan, Step, TaskPlan, TaskRun
from tests.integration.conftest import Infra
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


def unique(name: str) -> str:
    """An image reference no other test (or helper sharing the cluster) uses."""
    return f"nvcr.io/ckpteval-test/{name}:{uuid.uuid4().hex[:10]}"


def leftovers(directory: str) -> list[str]:
    """Files in the cache dir that are not finished .sqsh images."""
    if not os.path.isdir(directory):
        return []
    return sorted(f for f in os.listdir(directory) if not f.endswith(".sqsh") and f != ".enroot")


def sacct(job_id: str, fields: str, expected: str) -> str:
    """One job's accounting fields, polled until they equal `expected` or 30 s pass.

    slurmdbd fills a job's record in steps: for a moment after an srun allocation ends it still
    reads "allocation" with no account or partition.
    """

    def record() -> str:
        return subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", fields], capture_output=True, text=True, check=False
        ).stdout.strip()

    with contextlib.suppress(AssertionError):  # the caller compares, and shows what it read
        wait_until(lambda: record() == expected, timeout=60, what=f"job {job_id}'s record", interval=0.3)
    return record()


def sqsh_meta(path: str) -> dict:
    out = subprocess.run(["unsquashfs", "-cat", path, ".fake-enroot.json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def job_plan(deployment_image: str, *task_images: str) -> JobPlan:
    """A Slurm job's plan as build_plan makes it, reduced to what squashing reads: the steps' images."""
    tasks = tuple(
        TaskPlan(
            name=f"t{i}",
            dir_name=f"t{i}",
            runs=(TaskRun(run_config={}, step=Step(command="true", image=image)),),
            endpoint_url="http://127.0.0.1:8000/v1/completions",
        )
        for i, image in enumerate(task_images)
    )
    deployment = DeploymentPlan(
        kind="megatron/export-deploy",
        step=Step(command="true", image=deployment_image),
        health_url=None,
        readiness_timeout=60,
    )
    return JobPlan(invocation="inv", job_dir="/unused", deployment=deployment, tasks=tasks)


def squash_plan(plan: JobPlan, profile, *, remote) -> tuple[JobPlan, object]:
    """What `evaluate --run` does before submitting (cluster/launch.py): squash the plan's images, swap them in."""
    result = ensure_squashed(job_images(plan), profile, remote=remote)
    return with_images(plan, result.mapping), result


def images_of(plan: JobPlan) -> list[str | None]:
    assert plan.deployment.step is not None
    return [plan.deployment.step.image, *(t.runs[0].step.image for t in plan.tasks)]


def test_first_run_imports_on_a_compute_node_second_run_hits(ci_profile, infra: Infra, remote_job_dir):
    deploy, task = unique("nemo"), unique("lm-eval")
    # the same image in two places (deployment, task d) is imported once; a .sqsh path is used as it is
    plan = job_plan(deploy, task, task, "/already/there.sqsh", deploy)
    profile = ci_profile()
    with connect_remote(profile) as remote:
        new, result = squash_plan(plan, profile, remote=remote)
    cache = f"{remote_job_dir}/containers"
    deploy_path, task_path = f"{cache}/{sqsh_name(deploy)}", f"{cache}/{sqsh_name(task)}"
    assert images_of(new) == [deploy_path, task_path, task_path, "/already/there.sqsh", deploy_path]
    assert images_of(plan)[0] == deploy  # the input is not modified
    assert sorted(result.imported) == sorted([deploy, task])
    assert sqsh_meta(deploy_path)["uri"] == "docker://nvcr.io#" + deploy.removeprefix("nvcr.io/")
    assert leftovers(cache) == []
    for image in (deploy, task):
        (call,) = infra.enroot_calls(image.split(":")[1])
        user, job_id, gpus = call[1], call[3], call[4]
        assert user == infra.ssh_user and job_id != "-"  # ran inside a Slurm job
        assert gpus == "-"  # no GPUs unless asked for
        expected = f"ckpteval-squash|{infra.slurm_account}|{infra.slurm_partition}"
        assert sacct(job_id, "JobName,Account,Partition", expected) == expected
    assert oct(os.stat(f"{cache}/.enroot/cache").st_mode)[-3:] in ("755", "750", "700")

    with connect_remote(profile) as remote:
        again, second = squash_plan(plan, profile, remote=remote)
    assert again == new
    assert second.imported == ()
    for image in (deploy, task):
        assert len(infra.enroot_calls(image.split(":")[1])) == 1  # still only the first import


def test_build_step_can_ask_for_gpus_and_force_reimports(ci_profile, infra: Infra, remote_job_dir):
    image = unique("gpu")
    profile = ci_profile(build_include_gpus=True, gpus_per_node=2, build_time="00:05:00")
    refs = [ImageRef("deployment.image", image)]
    with connect_remote(profile) as remote:
        ensure_squashed(refs, profile, remote=remote)
        path = f"{remote_job_dir}/containers/{sqsh_name(image)}"
        first_inode = os.stat(path).st_ino
        forced = ensure_squashed(refs, profile, remote=remote, force=True)
    assert forced.imported == (image,)
    calls = infra.enroot_calls(image.split(":")[1])
    assert len(calls) == 2
    assert calls[0][4] == "0,1"  # two fake GPUs were allocated to the build step
    assert os.stat(path).st_ino != first_inode  # replaced by a rename, never rewritten in place
    assert leftovers(f"{remote_job_dir}/containers") == []
    assert sacct(calls[0][3], "Timelimit", "00:05:00") == "00:05:00"


def test_shell_metacharacters_never_run_anything(ci_profile, infra: Infra, remote_job_dir):
    canary = Path(f"/tmp/ckpteval-canary-{uuid.uuid4().hex[:8]}")
    profile = ci_profile()
    nasty = [
        f"repo/img:1;touch {canary}",
        f"repo/$(touch {canary})",
        f"repo/`touch {canary}`:1",
        f"repo/img:1' ; touch {canary}; '",
        f'repo/img:"1 {canary}"',
        "repo/img 1",
    ]
    for image in nasty:
        with pytest.raises(ConfigError, match="is not a container image reference"):
            # refused before connecting (the profile's host is never contacted)
            plan_squash(job_images(job_plan(image)), profile, check=True)
    # and when such a string does reach the cluster (validation bypassed), it is one quoted word
    with connect_remote(profile) as remote:
        plan = plan_squash([ImageRef("deployment.image", "repo/img:1")], profile, check=False)
        for image in nasty:
            item = plan.items[0].__class__(
                image=image, uri=f"docker://{image}", path=plan.items[0].path, dotpaths=("x",), status="missing"
            )
            with pytest.raises(ClusterError, match="Invalid image reference"):
                import_image(remote, item, plan)
    assert not canary.exists()
    assert leftovers(f"{remote_job_dir}/containers") == []


def test_remote_job_dir_with_spaces_quotes_and_dollar(ci_profile, infra: Infra, remote_job_dir):
    canary = Path(f"/tmp/ckpteval-canary-{uuid.uuid4().hex[:8]}")
    odd_dir = f"{remote_job_dir}/it's a $(touch {canary}) dir"
    profile = ci_profile(remote_job_dir=odd_dir)
    image = unique("odd")
    with connect_remote(profile) as remote:
        result = ensure_squashed([ImageRef("deployment.image", image)], profile, remote=remote)
    path = result.mapping[image]
    assert path == f"{odd_dir}/containers/{sqsh_name(image)}"
    assert Path(path).read_bytes()[:4] == b"hsqs"
    assert not canary.exists()


@pytest.mark.parametrize(
    ("name", "message", "hint"),
    [
        ("does-not-exist", "404 Not Found", "Check the image name and tag"),
        ("fake-nospace", "No space left on device", "Free space under"),
    ],
)
def test_failed_import_leaves_nothing_and_shows_enroots_error(
    ci_profile, infra: Infra, remote_job_dir, name, message, hint
):
    image = unique(name)
    profile = ci_profile()
    with connect_remote(profile) as remote, pytest.raises(ClusterError) as err:
        ensure_squashed([ImageRef("deployment.image", image)], profile, remote=remote)
    assert f"enroot import of {image} failed" in err.value.message
    assert message in err.value.message
    assert "[ERROR]" in err.value.message or "FATAL ERROR" in err.value.message
    assert hint in err.value.hint
    assert leftovers(f"{remote_job_dir}/containers") == []
    assert not os.path.exists(f"{remote_job_dir}/containers/{sqsh_name(image)}")


def test_unwritable_remote_job_dir(ci_profile, infra: Infra):
    profile = ci_profile(remote_job_dir="/root/ckpteval-not-yours")
    with connect_remote(profile) as remote, pytest.raises(ClusterError) as err:
        ensure_squashed([ImageRef("deployment.image", unique("x"))], profile, remote=remote)
    assert "Cannot write the .sqsh cache" in err.value.message
    assert "/root/ckpteval-not-yours/containers" in err.value.message
    assert "remote_job_dir" in err.value.hint


def test_connection_drop_mid_import_leaves_no_half_file(ci_profile, infra: Infra, remote_job_dir, write_env_toml):
    image = unique("fake-delay-6")
    env_file = write_env_toml("CI")
    cache = f"{remote_job_dir}/containers"
    target = f"{cache}/{sqsh_name(image)}"
    # a separate process that we kill -9 mid-import: its SSH connection drops without a goodbye
    code = (
        "from ckpteval.config.profiles import load_env_file\n"
        "from ckpteval.cluster.images import ImageRef\n"
        "from ckpteval.cluster.connect import connect_remote\n"
        "from ckpteval.cluster.squash import ensure_squashed\n"
        f"p = load_env_file(__import__('pathlib').Path({str(env_file)!r})).profile('CI')\n"
        f"ensure_squashed([ImageRef('deployment.image', {image!r})], p, remote=connect_remote(p))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        wait_until(
            lambda: infra.enroot_calls(image.split(":")[1]), timeout=120, what="the import's enroot call", interval=0.2
        )
        (call,) = infra.enroot_calls(image.split(":")[1])
        assert os.path.exists(f"{target}.lock")  # the import is under way, holding the lock
        time.sleep(1)
    finally:
        proc.kill()
        proc.wait()
    job_id = call[3]
    # the remote side notices (stdin EOF), cancels the srun step and cleans up

    def queued() -> str:
        return subprocess.run(
            ["squeue", "-h", "-j", job_id], capture_output=True, text=True, check=False
        ).stdout.strip()

    wait_until(
        lambda: not queued() and leftovers(cache) == [],
        timeout=120,
        what="the import's job to end and its files to go",
        interval=0.5,
        context=lambda: f"queued: {queued()!r}; left: {leftovers(cache)}",
    )
    assert not os.path.exists(target)

    profile = ci_profile()
    with connect_remote(profile) as remote:
        result = ensure_squashed([ImageRef("deployment.image", image)], profile, remote=remote)
    assert result.imported == (image,)
    assert sqsh_meta(target)["tag"] == image.split(":")[1]
    assert len(infra.enroot_calls(image.split(":")[1])) == 2
    assert leftovers(cache) == []


def test_two_concurrent_invocations_import_once(ci_profile, infra: Infra, remote_job_dir):
    image = unique("fake-delay-3")
    profile = ci_profile()
    results: dict[int, object] = {}
    events: dict[int, list[SquashEvent]] = {0: [], 1: []}

    def invoke(i: int) -> None:
        with connect_remote(profile) as remote:  # two invocations: two connections, two remote scripts
            results[i] = ensure_squashed(
                [ImageRef("deployment.image", image)], profile, remote=remote, on_event=events[i].append
            )

    threads = [threading.Thread(target=invoke, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.3)
    for t in threads:
        t.join(timeout=120)
    assert len(infra.enroot_calls(image.split(":")[1])) == 1
    imported = [results[i].imported for i in range(2)]
    assert sorted(imported) == [(), (image,)]
    waiter = 0 if imported[0] == () else 1
    assert "waiting" in [e.kind for e in events[waiter]]
    assert results[0].mapping == results[1].mapping
    assert leftovers(f"{remote_job_dir}/containers") == []


def test_progress_lines_arrive_while_the_import_runs(ci_profile, remote_job_dir):
    image = unique("fake-delay-3")
    profile = ci_profile()
    events: list[SquashEvent] = []
    with connect_remote(profile) as remote:
        result = ensure_squashed([ImageRef("deployment.image", image)], profile, remote=remote, on_event=events.append)
    took = result.import_seconds[image]
    layer_lines = [e for e in events if e.kind == "output" and "Downloading layer" in e.text]
    assert [e.text.split(": ")[-1] for e in layer_lines] == ["1/3 s", "2/3 s", "3/3 s"]
    assert layer_lines[0].elapsed < took - 1.5  # streamed, not delivered at the end
    assert [e.kind for e in events][:2] == ["checked", "importing"] and events[-1].kind == "imported"


def test_plan_checks_read_only_in_one_round_trip(ci_profile, infra: Infra, remote_job_dir, caplog):
    present, missing = unique("present"), unique("missing")
    profile = ci_profile()
    with connect_remote(profile) as remote:
        ensure_squashed([ImageRef("deployment.image", present)], profile, remote=remote)
        before = sorted(os.listdir(f"{remote_job_dir}/containers"))
        refs = [ImageRef("deployment.image", present), ImageRef("evaluation.tasks[0].container", missing)]
        with caplog.at_level("DEBUG", logger="ckpteval.remote"):
            plan = plan_squash(refs, profile, check=True, remote=remote)
    assert [(i.image, i.status) for i in plan.items] == [(present, "present"), (missing, "missing")]
    assert [plan.action(i) for i in plan.items] == ["use", "import"]
    assert len([r for r in caplog.records if "$ " in r.getMessage()]) == 1
    assert sorted(os.listdir(f"{remote_job_dir}/containers")) == before
    unchecked = plan_squash(refs, profile, check=False)  # no connection at all
    assert {i.status for i in unchecked.items} == {"unchecked"}


def test_local_tunnel_on_the_login_node(ci_profile, infra: Infra, tmp_path, monkeypatch):
    # the CLI running on the login node itself: same script, run by subprocess instead of SSH
    monkeypatch.setenv("PATH", f"{infra.enroot_bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENROOT_LOG", infra.enroot_log)
    profile = ci_profile(tunnel="local", host=None, remote_job_dir=str(tmp_path / "rjd"))
    image = unique("local")
    remote = connect_remote(profile)
    assert isinstance(remote, LocalRemote)
    new, result = squash_plan(job_plan(image), profile, remote=remote)
    assert result.imported == (image,)
    assert Path(images_of(new)[0]).read_bytes()[:4] == b"hsqs"
    (call,) = infra.enroot_calls(image.split(":")[1])
    assert call[1] == "root" and call[3] != "-"
    _, again = squash_plan(job_plan(image), profile, remote=remote)
    assert again.imported == ()
