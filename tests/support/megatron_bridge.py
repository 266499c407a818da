"""Megatron-Bridge's own code, run from its unpacked wheel, to check what our Bridge-layout builders write.

megatron-bridge cannot be installed here: it requires Transformer Engine (CUDA), mamba-ssm and
causal-conv1d. Its config readers and CPU loaders import those only to build GPU layers, so with
them (and a few other optional imports) stubbed, `read_run_config`, `load_model_config`,
`load_tokenizer` and `build_and_load_model(use_cpu_init=True)` run on a CPU.

The wheel is fetched once with pip (`pip download --no-deps`) into the uv cache directory
(`$UV_CACHE_DIR`, else ~/.cache/uv) under `ckpteval-wheels/`, and unpacked beside it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

BRIDGE_VERSION = "0.3.1"

# Imported by Bridge's modules, needed only on GPUs or for features a checkpoint check never uses.
_STUBBED_ROOTS = {
    "transformer_engine",
    "transformer_engine_torch",
    "mamba_ssm",
    "causal_conv1d",
    "fla",
    "flash_attn",
    "apex",
    "nvidia_resiliency_ext",
    "modelopt",
    "timm",
    "open_clip",
    "qwen_vl_utils",
    "mlflow",
    "einops",
    "tensorboard",
}
_STUBBED_PACKAGES = ("megatron.energon", "torch.utils.tensorboard")


def _cache_dir() -> Path:
    base = os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv")
    return Path(base).expanduser() / "ckpteval-wheels"


def _pip_commands() -> list[list[str]]:
    """Ways to run pip here: the interpreter's own, uv's (uvx), or one on PATH."""
    commands = []
    if importlib.util.find_spec("pip") is not None:
        commands.append([sys.executable, "-m", "pip"])
    if shutil.which("uvx"):
        commands.append(["uvx", "pip"])
    if shutil.which("pip"):
        commands.append(["pip"])
    return commands


def bridge_source(version: str = BRIDGE_VERSION) -> Path | str:
    """The unpacked megatron-bridge wheel (a directory to put on sys.path), or why it is not available."""
    cache = _cache_dir()
    unpacked = cache / f"megatron_bridge-{version}"
    if (unpacked / "megatron" / "bridge" / "__init__.py").is_file():
        return unpacked
    cache.mkdir(parents=True, exist_ok=True)
    wheel = next(cache.glob(f"megatron_bridge-{version}-*.whl"), None)
    errors = []
    for pip in _pip_commands() if wheel is None else []:
        result = subprocess.run(
            [*pip, "download", "--no-deps", "--only-binary", ":all:", f"megatron-bridge=={version}", "-d", str(cache)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        wheel = next(cache.glob(f"megatron_bridge-{version}-*.whl"), None)
        if wheel is not None:
            break
        errors.append(f"{' '.join(pip)}: {result.stderr.strip().splitlines()[-1:] or result.returncode}")
    if wheel is None:
        return f"megatron-bridge=={version} could not be downloaded from PyPI ({'; '.join(errors) or 'no pip found'})"
    tmp = cache / f".unpack-{os.getpid()}"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp)
    tmp.rename(unpacked)
    return unpacked


class _StubClass(type):
    """A class whose every attribute is another stub class: `te.ops.Sequential`, subclassable, callable."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub_class(name)
        setattr(cls, name, value)
        return value

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls


def _stub_class(name: str) -> Any:
    return _StubClass(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub_class(name)
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in _STUBBED_ROOTS or fullname.startswith(_STUBBED_PACKAGES):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def import_bridge(source: Path) -> None:
    """Make `megatron.bridge` importable from the unpacked wheel, its GPU-only imports stubbed.

    Call in a process of its own (a subprocess or a test module run alone): the stubs stay.
    """
    import megatron.core  # the real one first, so its optional-import probes see no stubs

    for name in _STUBBED_PACKAGES:
        sys.modules.pop(name, None)
    sys.meta_path.insert(0, _StubFinder())
    import megatron

    sys.path.insert(0, str(source))
    megatron.__path__.append(str(source / "megatron"))  # a namespace package: megatron.bridge joins it
