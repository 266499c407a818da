"""Datasets for clusters whose compute nodes have no internet, against real parts: `datasets` fetching from a
local stand-in of the Hugging Face Hub (real HTTP, the repositories' real layout), pushes over the real sshd,
and (slow) one Slurm job whose task reads the staged data with the hub gone."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpteval.cli.main import app
from ckpteval.cluster.connect import connect_remote
from ckpteval.cluster.data_push import push_archive, push_datasets, stage_script
from ckpteval.config.compose import CompileRequest, task_names
from ckpteval.errors import EvaluationError
from ckpteval.invocation.record import list_records
from ckpteval.tasks.data_cache import fetch_datasets, is_cached, read_manifest
from ckpteval.tasks.datasets import DatasetRef
from tests.integration.conftest import REPO
from tests.integration.slurm_jobs import free_port, wait_for
from tests.support.hf_hub import HubStandIn
from tests.support.hub_datasets import ALIASES, GATED_REPO, REMOTE_CODE_REPO, ROWS, write_repos

runner = CliRunner()
PIQA = DatasetRef("baber/piqa", None, None, ("train", "validation"))
ARC = DatasetRef("allenai/ai2_arc", "ARC-Challenge", None, ("test", "train", "validation"))
# no config named, and the repository's only one is not "default": the harness's call for HumanEval
HUMANEVAL = DatasetRef("openai/openai_humaneval", None, None, ("test",))
# the datasets library names its Arrow directory TIGER-Lab___mmlu-pro (its own snake case)
MMLU_PRO = DatasetRef("TIGER-Lab/MMLU-Pro", None, None, ("test", "validation"))


@pytest.fixture(scope="module")
def hub_repos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repos(tmp_path_factory.mktemp("hub"), mmlu=False)


@pytest.fixture
def hub(hub_repos: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    server = HubStandIn(hub_repos, gated=(GATED_REPO,), aliases=ALIASES)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fetched(tmp_path_factory: pytest.TempPathFactory, hub_repos: Path) -> tuple[Path, int]:
    """A dataset cache holding piqa and ARC-Challenge, fetched once through the stand-in (and its request count)."""
    server = HubStandIn(hub_repos, aliases=ALIASES)
    root = tmp_path_factory.mktemp("fetched")
    env = {**os.environ, "HF_ENDPOINT": server.url}
    try:
        old = os.environ.copy()
        os.environ.update(env)
        result = fetch_datasets([PIQA, ARC], root)
    finally:
        os.environ.clear()
        os.environ.update(old)
        server.stop()
    assert set(result.fetched) == {PIQA, ARC}
    return root, len(server.requests)


def cli(*argv: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(argv))
    assert "Traceback" not in result.output, result.output
    return result


def tree_digest(root: Path, subdir: str) -> dict[str, str]:
    base = root / subdir
    return {
        p.relative_to(base).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(base.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def test_fetched_data_is_what_the_harness_reads_offline_and_a_rerun_asks_the_hub_nothing(fetched, hub, tmp_path):
    root, n_requests = fetched
    assert n_requests > 0
    manifest = read_manifest(root, PIQA)
    assert manifest["dataset"] == "baber/piqa" and any(
        f.endswith(".parquet") for f in manifest["links"]
    )  # snapshots link to blobs
    # the same calls lm-eval makes, in a fresh process with the hub switched off, read the cache: kept where the
    # library put them (HumanEval names no config and its only one is not "default"; MMLU-Pro's directory is
    # the library's own snake case)
    fetch_datasets([HUMANEVAL, MMLU_PRO], tmp_path / "more")
    hub.requests.clear()
    calls = {
        "d = datasets.load_dataset('allenai/ai2_arc', 'ARC-Challenge')": (root, ROWS),
        "d = datasets.load_dataset('openai/openai_humaneval')": (tmp_path / "more", ROWS),
        "d = datasets.load_dataset('TIGER-Lab/MMLU-Pro')": (tmp_path / "more", 70),  # 5 items x 14 categories
    }
    for call, (cache, rows) in calls.items():
        env = {**os.environ, "HF_HOME": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        env.pop("HF_ENDPOINT")
        code = f"import datasets; {call}; print(len(d['test']))"
        out = subprocess.run([str(REPO / ".venv/bin/python"), "-c", code], env=env, capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == str(rows), (call, out.stderr[-2000:])
    again = fetch_datasets([PIQA, ARC], root)
    assert again.fetched == () and set(again.cached) == {PIQA, ARC}
    assert hub.requests == []  # nothing asked


def test_a_fetch_cut_off_leaves_nothing_complete_and_a_rerun_completes_it(hub, tmp_path):
    cache = tmp_path / "cache"
    hub.delays["validation-00000-of-00001.parquet"] = 30  # piqa's second file: the fetch hangs there
    proc = subprocess.Popen(
        [str(REPO / ".venv/bin/evaluate"), "data", "fetch", "-t", "piqa", "--cache", str(cache)],
        env={**os.environ},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for(
        lambda: (
            ("GET", "/datasets/baber/piqa/resolve/")
            and any(p.endswith("validation-00000-of-00001.parquet") and m == "GET" for m, p in hub.requests)
        ),
        timeout=90,
        what="the fetch reaching the second file",
    )
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its download process, as a closed terminal would
    proc.wait()
    assert not is_cached(cache, PIQA)
    assert not (cache / "hub").exists() or not any((cache / "hub").rglob("*.parquet"))  # only under .staging-*
    hub.delays.clear()
    done = cli("data", "fetch", "-t", "piqa", "--cache", str(cache))
    assert done.exit_code == 0, done.output
    assert "1 fetched" in done.output and is_cached(cache, PIQA)
    assert not list(cache.glob(".staging-*"))  # the killed fetch's staging dir was cleared


def test_gated_and_remote_code_datasets_are_one_clear_error_each(hub, tmp_path):
    good, gated, scripted = DatasetRef("baber/piqa"), DatasetRef(GATED_REPO), DatasetRef(REMOTE_CODE_REPO)
    with pytest.raises(EvaluationError) as failed:
        fetch_datasets([gated, scripted, good], tmp_path / "c")
    text = failed.value.message
    assert text.startswith("2 datasets could not be fetched (1 were):")
    assert f"Dataset {GATED_REPO} is gated" in text and f"Dataset {REMOTE_CODE_REPO} needs remote code" in text
    assert "hf auth login" in (failed.value.hint or "")
    assert not is_cached(tmp_path / "c", gated) and is_cached(tmp_path / "c", good)  # the others still fetched


def test_push_sends_only_what_is_missing_checked_by_content(
    fetched, infra, ci_profile, remote_job_dir, offline_profile, monkeypatch
):
    root, _ = fetched
    profile = ci_profile()
    target = f"{remote_job_dir}/datasets"
    with connect_remote(profile) as remote:
        first = push_datasets(remote, target, [PIQA, ARC], root)
        second = push_datasets(remote, target, [PIQA, ARC], root)
    # a dry run with --check asks the cluster (read-only) and shows them staged
    monkeypatch.setenv("COLUMNS", "300")
    shown = cli(*tiny_args(offline_profile(), "piqa", "adlr_winogrande_5_shot"), "--run", "CI", "--dry-run", "--check")
    assert shown.exit_code == 0, shown.output
    rows = {line.strip("│ ").split()[0]: line for line in shown.output.splitlines() if line.strip("│ ")}
    assert " staged " in rows["piqa"] and "missing" in rows["adlr_winogrande_5_shot"]
    assert set(first.staged) == {PIQA, ARC} and first.bytes_sent > 0 and first.round_trips == 2
    assert second.staged == () and second.bytes_sent == 0 and second.round_trips == 1
    for sub in ("hub", "datasets"):
        assert tree_digest(Path(target), sub) == tree_digest(root, sub)
    assert [p.name for p in Path(target).iterdir() if p.name.startswith(".push-")] == []


def test_two_concurrent_pushes_stage_once_and_a_cut_push_marks_nothing(fetched, infra, ci_profile, remote_job_dir):
    root, _ = fetched
    profile = ci_profile()
    target = f"{remote_job_dir}/datasets"
    # cut off: half the stream, then the connection ends (what a killed CLI leaves)
    archive = push_archive(root, [PIQA])
    with connect_remote(profile) as remote:
        cut = remote.run(
            ["bash", "-c", stage_script(), "ckpteval-data", target, PIQA.slug],
            stdin=archive[: len(archive) // 2],
            check=False,
        )
    assert cut.returncode == 12, cut.stderr
    assert not Path(target, "ckpteval", f"{PIQA.slug}.json").exists()
    assert [p.name for p in Path(target).iterdir() if p.name.startswith(".push-")] == []

    results = []

    def push() -> None:
        with connect_remote(profile) as remote:
            results.append(push_datasets(remote, target, [PIQA], root))

    threads = [threading.Thread(target=push) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(len(r.staged) for r in results) == [0, 1]  # one staged it, the other found it there


@pytest.fixture
def offline_profile(write_env_toml):  # type: ignore[no-untyped-def]
    """A profile of the test cluster whose compute nodes are declared offline; jobs run this project's venv."""
    venv_bin = REPO / ".venv" / "bin"

    def write(**overrides):  # type: ignore[no-untyped-def]
        values = {
            "python": str(venv_bin / "python"),
            "gpus_per_node": 8,
            "compute_internet": False,
            "env_vars": {"PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin"},
            **overrides,
        }
        return write_env_toml("CI", **values)

    return write


def tiny_args(env: Path, *tasks: str) -> list[str]:
    """The tiny random-weight checkpoint served by the builtin server, 3 items per task."""
    return [
        "-c",
        "tiny",
        "--env-file",
        str(env),
        *(a for t in tasks for a in ("-t", t)),
        "deployment.prepare=tiny",
        "run.model=${execution.cache_dir}/checkpoints/tiny",
        f"deployment.port={free_port()}",
        "evaluation.nemo_evaluator_config.config.params.limit_samples=3",
    ]


def test_a_task_whose_data_is_not_staged_is_refused_before_anything_happens(offline_profile, infra, remote_job_dir):
    result = cli(*tiny_args(offline_profile(), "piqa", "adlr_mmlu"), "--batch", "CI")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split("error:", 1)[1].split())
    assert "compute_internet = false" in text and "piqa: baber/piqa" in text
    assert "adlr_mmlu" not in text  # packaged offline data: it runs
    assert "evaluate data fetch -t piqa && evaluate data push CI" in text
    assert list_records() == []
    assert not os.path.exists(remote_job_dir)  # nothing uploaded, squashed or pushed


def test_the_dry_run_shows_each_tasks_data_without_connecting(offline_profile, fetched, monkeypatch):
    monkeypatch.setenv("CKPTEVAL_DATA_CACHE", str(fetched[0]))
    monkeypatch.setenv("COLUMNS", "300")
    env = offline_profile(host="cluster.invalid")
    # simpleqa is scored by a judge: the model judges itself here (the dry run asks for one)
    tasks = tiny_args(env, "piqa", "adlr_mmlu", "adlr_winogrande_5_shot", "simpleqa")
    shown = cli(*tasks, "judge=self", "--run", "CI", "--dry-run")
    assert shown.exit_code == 0, shown.output
    rows = {line.strip("│ ").split()[0]: line for line in shown.output.splitlines() if line.strip("│ ")}
    assert "unchecked" in rows["piqa"] and "baber/piqa" in rows["piqa"]
    assert "packaged offline data" in rows["adlr_mmlu"]
    assert "missing" in rows["adlr_winogrande_5_shot"] and "winogrande:winogrande_xl" in rows["adlr_winogrande_5_shot"]
    assert "own data" in rows["simpleqa"] and "unchecked: this harness downloads its own data" in rows["simpleqa"]
    assert "HF_HUB_OFFLINE=1" in shown.output


@pytest.mark.slow
def test_fetch_then_run_on_an_offline_cluster_scores_the_staged_data_as_a_local_run_does(
    offline_profile, hub, infra, tiny_checkpoint
):
    fetch = cli("data", "fetch", "-c", "pretrain", "-t", "piqa")
    assert fetch.exit_code == 0, fetch.output
    hub.stop()  # from here on no hub answers: the job's task steps have nothing to reach
    model = ["deployment.prepare=null", f"run.model={tiny_checkpoint}"]
    run = cli(*tiny_args(offline_profile(), "piqa"), *model, "--run", "CI")
    assert "datasets staged: 1 sent" in run.output, run.output
    record = next(r for r in list_records() if r.executor == "slurm")
    results = json.loads(cli("results", record.id, "--json").stdout)
    task = results["tasks"]["piqa"]
    logs = cli("logs", record.id, "--source", "piqa").output
    assert run.exit_code == 0 and task["status"] == "succeeded", run.output[-3000:] + logs[-3000:]
    assert task["n_samples"] == 3
    script = Path(record.job_dir, "job.sh").read_text()
    assert "HF_HUB_OFFLINE=1" in script and f"{Path(record.job_dir).parents[1]}/datasets" in script
    # the items scored are the stand-in hub's piqa validation rows, as staged (not packaged stand-ins)
    outputs = " ".join(
        p.read_text(errors="replace") for p in Path(record.job_dir, "tasks").rglob("*.json*") if p.is_file()
    )
    assert "To open a jar (validation 0)" in outputs

    # the same task on this machine, from the same dataset cache and checkpoint, scores the same
    local = cli(*tiny_args(offline_profile(), "piqa"), *model)
    assert local.exit_code == 0, local.output[-3000:]
    mine = next(r for r in list_records() if r.executor == "local")
    here = json.loads(cli("results", mine.id, "--json").stdout)["tasks"]["piqa"]
    assert here["n_samples"] == 3
    for metric in ("acc", "acc_norm"):
        assert here["metrics"][metric]["value"] == pytest.approx(task["metrics"][metric]["value"], abs=1e-9)


@pytest.fixture
def full_hub(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    """The stand-in serving every dataset of the stage configs, MMLU's 57 subjects included."""
    server = HubStandIn(write_repos(tmp_path_factory.mktemp("full-hub")), aliases=ALIASES)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    yield server
    server.stop()


# every task of the packaged stage configs: pretrain's six, and sft's and rl's gsm8k, HumanEval and MMLU-Pro
STAGE_TASKS = tuple(
    dict.fromkeys(t for c in ("pretrain", "sft", "rl") for t in task_names(CompileRequest(configs=(c,))))
)


@pytest.mark.slow
@pytest.mark.long  # nine tasks on the cluster and here on 2 cores; the piqa test above is the default tier's
@pytest.mark.timeout(3600)
def test_every_stage_task_fetched_pushed_and_run_offline_on_the_cluster_scores_as_here(
    offline_profile, full_hub, infra, tiny_checkpoint, tmp_path, monkeypatch
):
    assert len(STAGE_TASKS) == 9
    monkeypatch.setenv("CKPTEVAL_DATA_CACHE", str(tmp_path / "cache"))
    fetch = cli("data", "fetch", "-c", "pretrain")
    assert fetch.exit_code == 0, fetch.output
    assert "62 fetched, 0 already cached" in fetch.output  # 57 MMLU subjects + 5, legacy ids included
    fetch = cli("data", "fetch", "-c", "sft", "-c", "rl")  # gsm8k, HumanEval, MMLU-Pro: the rest were fetched
    assert fetch.exit_code == 0, fetch.output
    assert "3 fetched, 60 already cached" in fetch.output
    full_hub.stop()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # and no hub here either: the local run reads the same cache
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    model = ["deployment.prepare=null", f"run.model={tiny_checkpoint}"]
    few_tokens = "evaluation.nemo_evaluator_config.config.params.max_new_tokens=16"  # gsm8k, HumanEval
    args = [*tiny_args(offline_profile(), *STAGE_TASKS), *model, few_tokens]
    run = cli(*args, "--run", "CI")
    assert "datasets staged: 65 sent" in run.output, run.output[-3000:]
    record = next(r for r in list_records() if r.executor == "slurm")
    there = json.loads(cli("results", record.id, "--json").stdout)["tasks"]
    assert run.exit_code == 0 and {t: there[t]["status"] for t in STAGE_TASKS} == dict.fromkeys(
        STAGE_TASKS, "succeeded"
    ), run.output[-3000:]
    local = cli(*args)
    assert local.exit_code == 0, local.output[-3000:]
    mine = next(r for r in list_records() if r.executor == "local")
    here = json.loads(cli("results", mine.id, "--json").stdout)["tasks"]
    for task in STAGE_TASKS:
        assert here[task]["n_samples"] == there[task]["n_samples"] > 0
        assert {m: v["value"] for m, v in here[task]["metrics"].items()} == pytest.approx(
            {m: v["value"] for m, v in there[task]["metrics"].items()}, abs=1e-9
        ), task
