"""Copy a real task directory (from a real `nemo-evaluator run_eval`) into a small golden fixture.

    python tests/unit/tasks/golden/refresh.py SRC_TASK_DIR NAME [--log-lines N]

Kept: the files ckpteval reads (results.yml, the output dir's run_config.yml, eval_factory_metrics.json,
offline_data.json, progress, lm-eval's results_*.json) and the last N lines of client.log without the
indented lines of Python tracebacks (frames and source lines; the exception lines stay). Trimmed:
lm-eval's per-task `configs` and `pretty_env_info` (most of the bytes; ckpteval does not read them),
and paths are rewritten to a placeholder. Values are never edited.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP = ("results.yml", "run_config.yml", "eval_factory_metrics.json", "offline_data.json", "progress")
DROP_KEYS = ("configs", "pretty_env_info")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("src", type=Path)
    parser.add_argument("name")
    parser.add_argument("--log-lines", type=int, default=150)
    args = parser.parse_args()
    src: Path = args.src
    dst = HERE / args.name
    shutil.rmtree(dst, ignore_errors=True)
    (dst / "artifacts").mkdir(parents=True)
    prefix = str(src)

    def scrub(text: str) -> str:
        return text.replace(prefix, "/TASK_DIR")

    for name in KEEP:
        path = src / "artifacts" / name
        if path.is_file():
            (dst / "artifacts" / name).write_text(scrub(path.read_text()))
    for path in (src / "artifacts").glob("*/results_*.json"):
        data = json.loads(path.read_text())
        for key in DROP_KEYS:
            data.pop(key, None)
        out = dst / "artifacts" / path.parent.name / path.name
        out.parent.mkdir(exist_ok=True)
        out.write_text(scrub(json.dumps(data, indent=1)))
    log = src / "client.log"
    if log.is_file():
        lines = [line for line in log.read_text(errors="replace").splitlines() if not line.startswith(" ")]
        lines = lines[-args.log_lines :]
        (dst / "client.log").write_text(scrub("\n".join(lines) + "\n"))


if __name__ == "__main__":
    main()
