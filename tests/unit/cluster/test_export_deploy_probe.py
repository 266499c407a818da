"""The Export-Deploy probe as it runs in an image: list the entry points, run `--help`, pick one, cache it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpteval.cluster import export_deploy as probe
from ckpteval.cluster.remote import LocalRemote
from ckpteval.deploy.export_deploy import CANDIDATES, MLM_FLAGS, MLM_SCRIPT, NLP_SCRIPT, EntryPoint
from ckpteval.errors import ClusterError

REPO = Path(__file__).resolve().parents[3]
STAND_IN = REPO / "tests" / "infra" / "export-deploy" / MLM_SCRIPT
OLD_NLP = """import argparse
parser = argparse.ArgumentParser(description="Deploy a Megatron model using Ray")
parser.add_argument("--nemo_checkpoint", type=str, required=True, help="Path to the .nemo file")
parser.add_argument("--num_gpus", type=int, default=1)
parser.add_argument("--num_nodes", type=int, default=1)
parser.add_argument("--enable_cuda_graphs", action="store_true")
parser.parse_args()
"""


def run_probe(root: Path, tmp_path: Path) -> str:
    """The probe script's output in an "image" whose Export-Deploy tree is `root` (`python` on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").unlink(missing_ok=True)
    (bin_dir / "python").symlink_to(sys.executable)
    argv = probe.probe_argv(_profile(), "/c/img.sqsh")
    script_at = argv.index("bash")
    words = argv[script_at:]
    words[words.index(probe.EXPORT_DEPLOY_ROOT)] = str(root)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(words, capture_output=True, text=True, env=env, timeout=120, check=True).stdout


def _profile():  # type: ignore[no-untyped-def]
    from ckpteval.config.profiles import make_profile

    return make_profile(name="c", executor="slurm", account="acct", partition="batch", remote_job_dir="/c")


def tree(tmp_path: Path, **scripts: str | Path) -> Path:
    root = tmp_path / "Export-Deploy"
    for rel, content in ((MLM_SCRIPT, scripts.get("mlm")), (NLP_SCRIPT, scripts.get("nlp"))):
        if content is None:
            continue
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copy(content, path)
        else:
            path.write_text(content)
    root.mkdir(exist_ok=True)
    return root


def test_probe_command_runs_the_candidates_in_the_image_on_a_compute_node():
    argv = probe.probe_argv(_profile(), "/c/containers/nemo.sqsh")
    assert argv[0] == "srun" and "--job-name=ckpteval-probe" in argv and "--account=acct" in argv
    assert "--container-image=/c/containers/nemo.sqsh" in argv
    assert argv[-len(CANDIDATES) - 1 :] == [probe.EXPORT_DEPLOY_ROOT, *CANDIDATES]
    # the deployment step's environment (PATH, ...) reaches the probe, quoted
    with_env = probe.probe_argv(_profile(), "/c/x.sqsh", {"PATH": "/opt/py/bin:/usr/bin", "A": "it's"})
    script = with_env[with_env.index("-c") + 1]
    assert script.startswith("export A='it'\"'\"'s'\nexport PATH=/opt/py/bin:/usr/bin\n")


def test_the_new_layout_is_preferred_and_its_flags_read_from_help(tmp_path: Path):
    out = run_probe(tree(tmp_path, mlm=STAND_IN, nlp=OLD_NLP), tmp_path)
    entry = probe.parse_probe(out, image="nemo.sqsh")
    assert entry.script.endswith(MLM_SCRIPT) and entry.source == "probe"
    assert entry.flags - {"--help"} == MLM_FLAGS and not entry.required


def test_the_old_layout_with_its_required_flag(tmp_path: Path):
    out = run_probe(tree(tmp_path, nlp=OLD_NLP), tmp_path)
    entry = probe.parse_probe(out, image="nemo.sqsh")
    assert entry.script.endswith(NLP_SCRIPT)
    assert entry.required == {"--nemo_checkpoint"} and "--num_nodes" in entry.flags


def test_an_image_without_export_deploy_is_one_clear_error(tmp_path: Path):
    out = run_probe(tree(tmp_path), tmp_path)
    with pytest.raises(ClusterError, match=r"Image nemo\.sqsh has no Export-Deploy entry point"):
        probe.parse_probe(out, image="nemo.sqsh")


def test_a_script_that_cannot_run_shows_why(tmp_path: Path):
    out = run_probe(tree(tmp_path, mlm="import nemo_deploy_missing\n"), tmp_path)
    with pytest.raises(ClusterError, match=r"(?s)--help` exited 1.*No module named 'nemo_deploy_missing'"):
        probe.parse_probe(out, image="nemo.sqsh")


def test_cache_lives_beside_the_squashed_image_and_goes_stale_with_it(tmp_path: Path):
    containers = tmp_path / "containers"
    containers.mkdir()
    image = containers / "nvcr.io+nvidia+nemo+25.11-0123456789.sqsh"
    image.write_bytes(b"hsqs")
    cache = probe.cache_path(str(containers), str(image))
    assert cache == str(containers / "nvcr.io+nvidia+nemo+25.11-0123456789.export-deploy.json")
    elsewhere = probe.cache_path(str(containers), "/data/images/nemo.sqsh")
    assert elsewhere.startswith(str(containers) + "/nemo-") and elsewhere.endswith(".export-deploy.json")

    remote = LocalRemote()
    assert probe.read_cached(remote, cache, str(image)) is None
    entry = EntryPoint(script="/opt/Export-Deploy/x.py", flags=frozenset({"--megatron_checkpoint"}))
    Path(cache).write_text(entry.to_json())
    cached = probe.read_cached(remote, cache, str(image))
    assert cached is not None and (cached.script, cached.source, cached.where) == (entry.script, "cache", cache)
    later = time.time() + 5  # the image was re-imported after the probe: probe again
    os.utime(image, (later, later))
    assert probe.read_cached(remote, cache, str(image)) is None
    Path(cache).write_text("not json")
    os.utime(Path(cache), (later + 5, later + 5))
    assert probe.read_cached(remote, cache, str(image)) is None  # damaged: probed again
