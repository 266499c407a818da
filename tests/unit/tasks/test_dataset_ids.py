"""Owner-less legacy dataset ids: the table is complete for the catalog, `data fetch` names the canonical
repository (revision kept), and the harness hook loads the canonical repository when the harness asks for the
old id, from a hub (the stand-in, real HTTP) and from the dataset cache with the hub gone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckpteval.tasks.catalog import load_catalog
from ckpteval.tasks.client import hook_dir
from ckpteval.tasks.data_cache import fetch_datasets
from ckpteval.tasks.datasets import LM_EVAL_HARNESS, DatasetRef, _read_yaml, lm_eval_datasets, lm_eval_tasks_dir
from ckpteval.tasks.harness_hook.ckpteval_dataset_ids import CANONICAL_IDS, canonical_id, legacy_ids
from tests.support.hf_hub import HubStandIn
from tests.support.hub_datasets import ALIASES, ROWS, write_repos

WINOGRANDE = DatasetRef("allenai/winogrande", "winogrande_xl", None, ("train", "validation"))


def test_every_owner_less_id_of_the_catalogs_lm_eval_tasks_has_its_canonical_repository() -> None:
    catalog = load_catalog()
    lm_tasks = {str(s.params.get("task")) for s in catalog.tasks if s.harness == LM_EVAL_HARNESS}
    root = lm_eval_tasks_dir()
    assert root is not None
    # what the harness's own YAML names (before our rewrite): every owner-less id there is in the table
    raw = set()
    for path in root.rglob("*.yaml"):
        text = path.read_text(errors="replace")
        for line in text.splitlines():
            if line.startswith("dataset_path:"):
                raw.add(line.split(":", 1)[1].strip().strip("\"'"))
    owner_less_in_lm_eval = {p for p in raw if "/" not in p}
    ours = {ref.path for task in lm_tasks for ref in lm_eval_datasets(task)}
    assert all("/" in p or p in ("json", "csv", "parquet") for p in ours), ours  # none left for the catalog
    assert set(CANONICAL_IDS) <= owner_less_in_lm_eval  # no entry for an id the harness does not use
    assert {c.canonical for c in CANONICAL_IDS.values()} <= ours  # and each is used by a catalog task
    assert canonical_id("hellaswag") == "Rowan/hellaswag" and canonical_id("winogrande") == "allenai/winogrande"
    assert canonical_id("openbookqa") == "allenai/openbookqa" and canonical_id("baber/piqa") == "baber/piqa"
    assert legacy_ids("allenai/winogrande") == ("winogrande",) and legacy_ids("baber/piqa") == ()
    assert _read_yaml(root / "winogrande" / "default.yaml")["dataset_path"] == "winogrande"  # still the old id


def test_the_pretrain_tasks_name_canonical_repositories_and_a_pinned_revision_is_kept(tmp_path: Path) -> None:
    assert lm_eval_datasets("winogrande") == (WINOGRANDE,)
    assert [r.path for r in lm_eval_datasets("hellaswag")] == ["Rowan/hellaswag"]
    assert [(r.path, r.name) for r in lm_eval_datasets("openbookqa")] == [("allenai/openbookqa", "main")]
    (tmp_path / "t.yaml").write_text(
        "task: pinned\ndataset_path: winogrande\ndataset_name: winogrande_xl\n"
        "dataset_kwargs:\n  revision: 0123abcd\ntest_split: validation\n"
    )
    assert lm_eval_datasets("pinned", root=tmp_path) == (
        DatasetRef("allenai/winogrande", "winogrande_xl", "0123abcd", ("validation",)),
    )


LOAD = """
import datasets
d = datasets.load_dataset("winogrande", "winogrande_xl")
print(len(d["validation"]), d["validation"][0]["sentence"])
"""


def run_client(code: str, *, hook: bool, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter, as the task client starts it (the hook dir on PYTHONPATH) or without it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTEVAL_", "PYTHONPATH", "HF_"))}
    full = {**base, **({"PYTHONPATH": hook_dir()} if hook else {}), "CKPTEVAL_OFFLINE_DATA": "off", **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full, timeout=300
    )


@pytest.mark.slow
def test_the_harness_asks_for_the_old_id_and_reads_the_canonical_repository_online_and_staged(tmp_path: Path) -> None:
    hub = HubStandIn(write_repos(tmp_path / "hub", mmlu=False), aliases=ALIASES)  # with the hub's redirects
    cache = tmp_path / "cache"
    try:
        online = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "home")}
        bare = run_client(LOAD, hook=False, **online)
        assert bare.returncode != 0 and "Repository id must be 'namespace/name'" in bare.stderr  # the bug
        hub.requests.clear()
        hooked = run_client(LOAD, hook=True, **online)
        assert hooked.returncode == 0, hooked.stderr[-3000:]
        assert hooked.stdout.split("\n")[0].startswith(f"{ROWS} The cup did not fit")
        asked = {p for _, p in hub.requests}
        assert any(p.startswith("/api/datasets/allenai/winogrande") for p in asked)
        assert not any("/datasets/winogrande" in p for p in asked)
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            assert fetch_datasets([WINOGRANDE], cache).fetched == (WINOGRANDE,)
        finally:
            del os.environ["HF_ENDPOINT"]
    finally:
        hub.stop()
    # the hub gone, the cache as staged: the old id reads the staged canonical repository
    staged = run_client(LOAD, hook=True, HF_HOME=str(cache), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    assert staged.returncode == 0, staged.stderr[-3000:]
    assert staged.stdout == hooked.stdout
