"""The dataset cache: tasks' datasets fetched from a reachable hub into one Hugging Face cache directory.

Layout (the same here and in `${remote_job_dir}/datasets/` on a cluster; it is an `HF_HOME`):
    hub/datasets--<owner>--<name>/...        huggingface_hub's download cache (blobs, snapshots, refs)
    datasets/<owner>___<name>/<config>/...   datasets' prepared Arrow files
    ckpteval/<slug>.json                     one manifest per dataset: its files, sizes and sha256

A dataset is in the cache when its manifest is: the manifest is written last, after every file has been
moved into place, so a fetch cut off half-way leaves nothing that reads as complete, and a rerun fetches
it again. Each fetch downloads into its own staging `HF_HOME` (`.staging-<pid>/`) in a child process
(the hub's settings are read at import), and moves files into the cache file by file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import EvaluationError
from ckpteval.tasks.datasets import DatasetRef

CACHE_ENV = "CKPTEVAL_DATA_CACHE"
MANIFEST_DIR = "ckpteval"
_SKIP_SUFFIXES = (".lock",)


def default_cache_dir() -> Path:
    """`$CKPTEVAL_DATA_CACHE`, else `~/.cache/ckpteval/datasets`."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ckpteval" / "datasets"


def manifest_rel(ref: DatasetRef) -> str:
    """The manifest's path relative to the cache root."""
    return f"{MANIFEST_DIR}/{ref.slug}.json"


def dataset_subtrees(ref: DatasetRef, arrow: str | None = None) -> tuple[str, str]:
    """The two directories (relative to the cache root) that hold `ref`'s files: the hub's snapshot, and the
    prepared Arrow files of its config. `arrow`: where the datasets library put those when it loaded `ref`
    (relative to its cache): its naming is its own (`TIGER-Lab___mmlu-pro`, and a config chosen when `ref`
    names none, e.g. openai/openai_humaneval's only one, `openai_humaneval`); else the usual place."""
    repo = ref.path.replace("/", "--")
    return f"hub/datasets--{repo}", f"datasets/{arrow or ref.path.replace('/', '___') + '/' + (ref.name or 'default')}"


def is_cached(root: Path, ref: DatasetRef) -> bool:
    """True when `ref`'s manifest is in the cache (so every file of it is)."""
    return (root / manifest_rel(ref)).is_file()


def read_manifest(root: Path, ref: DatasetRef) -> dict[str, Any]:
    return json.loads((root / manifest_rel(ref)).read_text(encoding="utf-8"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _wanted(rel: Path) -> bool:
    return not rel.name.endswith(_SKIP_SUFFIXES) and ".incomplete" not in rel.name


def _files_of(staging: Path, ref: DatasetRef, arrow: str | None) -> list[Path]:
    out: list[Path] = []
    for sub in dataset_subtrees(ref, arrow):
        base = staging / sub
        if base.is_dir():
            out.extend(p for p in sorted(base.rglob("*")) if (p.is_file() or p.is_symlink()) and _wanted(p))
    return out


def _install(staging: Path, root: Path, ref: DatasetRef, arrow: str | None = None) -> dict[str, Any]:
    """Move `ref`'s files from `staging` into `root` one by one, then write its manifest (last)."""
    files: dict[str, Any] = {}
    links: dict[str, str] = {}
    for path in _files_of(staging, ref, arrow):
        rel = path.relative_to(staging).as_posix()
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            links[rel] = os.readlink(path)
            tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
            tmp.unlink(missing_ok=True)
            os.symlink(links[rel], tmp)
            os.replace(tmp, dest)
        else:
            files[rel] = [path.stat().st_size, _sha256(path)]
            os.replace(path, dest)
    manifest = {"dataset": ref.key, "path": ref.path, "name": ref.name, "revision": ref.revision, "files": files}
    manifest["links"] = links
    target = root / manifest_rel(ref)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, target)
    return manifest


@dataclass(frozen=True)
class FetchResult:
    """What `fetch_datasets` did: fetched now, already cached."""

    root: Path
    fetched: tuple[DatasetRef, ...]
    cached: tuple[DatasetRef, ...]


_WORKER = r"""
import json, os, sys
import datasets
root = os.path.realpath(datasets.config.HF_DATASETS_CACHE)
for line in sys.stdin:
    ref = json.loads(line)
    try:
        loaded = datasets.load_dataset(ref["path"], ref["name"], revision=ref["revision"])
    except Exception as exc:
        print(json.dumps({"key": ref["key"], "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        continue
    # <cache>/<dataset>/<config>/<version>/<hash>/<file>.arrow: the dataset's and config's directories as named
    arrow = {
        os.path.relpath(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(f["filename"])))), root)
        for split in loaded.values()
        for f in split.cache_files
    }
    one = arrow.pop() if len(arrow) == 1 else None
    one = None if one is None or one.startswith("..") else one
    print(json.dumps({"key": ref["key"], "ok": True, "arrow": one}), flush=True)
"""


def _clear_stale_staging(root: Path) -> None:
    for staging in root.glob(".staging-*"):
        pid = staging.name.removeprefix(".staging-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(staging, ignore_errors=True)


def fetch_error(ref: DatasetRef, error: str) -> EvaluationError:
    """One clear message for a dataset that cannot be fetched: gated, remote code, not found, no hub."""
    if "GatedRepo" in error or "gated" in error.lower() or "restricted" in error:
        return EvaluationError(
            f"Dataset {ref.key} is gated: the hub serves it only to a logged-in user who accepted its terms.",
            hint=f"Accept its terms on the hub's page for {ref.path}, run `hf auth login`, then fetch again.",
        )
    if "Dataset scripts are no longer supported" in error or "trust_remote_code" in error:
        return EvaluationError(
            f"Dataset {ref.key} needs remote code (a loading script), which the datasets library no longer runs.",
            hint="Use a revision of it with data files (parquet), or save it with `save_to_disk` and set the "
            "task's dataset_dir.",
        )
    if "Repository id must be 'namespace/name'" in error:
        return EvaluationError(
            f"Dataset {ref.key}: the installed huggingface_hub/datasets refuse a dataset id without a namespace, "
            "so the harness cannot load it by that name either.",
            hint="ckpteval loads the legacy ids of the catalog's tasks by their owners' ids "
            "(tasks/harness_hook/ckpteval_dataset_ids.py); for this one, use a task YAML with the owner's id "
            "(what the hub's /api/datasets/<id> answers).",
        )
    if "RepoNotFound" in error or "DatasetNotFound" in error or "doesn't exist" in error:
        return EvaluationError(f"Dataset {ref.key} was not found on the hub: {error[:300]}")
    return EvaluationError(
        f"Cannot fetch dataset {ref.key}: {error[:500]}",
        hint="Fetch where the Hugging Face Hub is reachable (a workstation, the login node), or set HF_ENDPOINT.",
    )


def fetch_datasets(
    refs: Iterable[DatasetRef],
    root: Path | None = None,
    *,
    on_progress: Callable[[DatasetRef, str], None] | None = None,
) -> FetchResult:
    """Download each of `refs` not yet in the cache `root` (a Hugging Face cache dir), one at a time.

    Needs a reachable hub (`HF_ENDPOINT` is honoured). A dataset that fails (gated, remote code, not found,
    no hub) does not stop the others; at the end one EvaluationError names each that failed, and the
    datasets fetched stay in the cache.
    """
    root = root or default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    _clear_stale_staging(root)
    note = on_progress or (lambda _r, _s: None)
    todo: list[DatasetRef] = []
    cached: list[DatasetRef] = []
    for ref in dict.fromkeys(refs):
        (cached if is_cached(root, ref) else todo).append(ref)
    for ref in cached:
        note(ref, "cached")
    if not todo:
        return FetchResult(root, (), tuple(cached))
    staging = root / f".staging-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_CACHE")}
    env.update(
        {"HF_HOME": str(staging), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_DATASETS_CACHE": str(staging / "datasets")}
    )
    fetched: list[DatasetRef] = []
    failed: list[EvaluationError] = []
    staging.mkdir(parents=True, exist_ok=True)
    log = (staging / "fetch.log").open("w+")  # the child's progress bars; read back for an error
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
        )
        assert proc.stdin and proc.stdout
        for ref in todo:
            note(ref, "fetching")
            proc.stdin.write(
                json.dumps({"key": ref.key, "path": ref.path, "name": ref.name, "revision": ref.revision}) + "\n"
            )
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line.strip():
                proc.wait()
                log.seek(0)
                answer = {"error": log.read()[-800:]}
            else:
                answer = json.loads(line)
            if not answer.get("ok"):
                failed.append(fetch_error(ref, str(answer.get("error") or "the fetch process ended")))
                note(ref, "failed")
                if proc.poll() is not None:
                    break
                continue
            _install(staging, root, ref, answer.get("arrow"))
            fetched.append(ref)
            note(ref, "fetched")
        proc.stdin.close()
        proc.wait()
    finally:
        log.close()
        shutil.rmtree(staging, ignore_errors=True)
    if len(failed) == 1:
        raise failed[0]
    if failed:
        raise EvaluationError(
            f"{len(failed)} datasets could not be fetched ({len(fetched)} were):\n"
            + "\n".join(f"- {e.message}" for e in failed),
            hint=failed[0].hint,
        )
    return FetchResult(root, tuple(fetched), tuple(cached))


def cached_datasets(root: Path) -> list[DatasetRef]:
    """Every dataset in the cache `root` (from its manifests)."""
    out = []
    for path in sorted((root / MANIFEST_DIR).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out.append(DatasetRef(data["path"], data.get("name"), data.get("revision")))
    return out


def offline_env(root: str) -> dict[str, str]:
    """The environment of a task that reads its datasets from the cache `root` with no network."""
    return {
        "HF_HOME": root,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "CKPTEVAL_OFFLINE_DATA": "off",  # the real datasets are there: packaged stand-ins must not shadow them
    }
