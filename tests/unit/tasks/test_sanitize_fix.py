"""A HumanEval completion holding a NUL byte is code that does not parse, not the end of the task: lm-eval's
sanitizer (through evalplus's `syntax_check`) raised ValueError on early Python 3.11 releases (Debian 12's
3.11.2; 3.11.7 raises SyntaxError) and failed the whole task (seen with a random-weight checkpoint). Real
lm-eval, started as the job starts it (the hook directory first on PYTHONPATH)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from ckpteval.tasks.client import hook_dir

SANITIZE = """
import json, sys
from lm_eval.filters.sanitize import sanitize
prompt = "def add(a, b):\\n"
out = {}
for name, completion in (("nul", "    return a\\x00 + b\\n"), ("fine", "    return a + b\\n")):
    try:
        out[name] = {"code": sanitize(prompt + completion, "add")}
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def run(pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, "-c", SANITIZE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_completion_with_a_nul_byte_is_sanitized_like_any_unparsable_code() -> None:
    hooked = run(hook_dir())
    assert "\x00" not in hooked["nul"]["code"] and "error" not in hooked["nul"]
    assert hooked["fine"] == {"code": "def add(a, b):\n    return a + b"}
    # the harness alone: the control that makes the test count where this interpreter's parser raises
    # ValueError on a NUL byte (Debian 12's 3.11.2; 3.11.7 and 3.12 raise SyntaxError, which
    # evalplus catches)
    if parser_raises_value_error_on_nul():
        assert "null bytes" in run(None)["nul"].get("error", "")


def parser_raises_value_error_on_nul() -> bool:
    try:
        ast.parse("a = 1\x00")
    except ValueError:
        return True
    except SyntaxError:
        return False
    return False
