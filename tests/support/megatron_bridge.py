"""Megatron-Bridge's own code, run from its unpacked wheel: to check what our Bridge-layout builders write,
and to write checkpoints with Bridge's own Hugging Face importer.

megatron-bridge cannot be installed here: it requires Transformer Engine (CUDA), mamba-ssm and
causal-conv1d. Its config readers and CPU loaders import those only to build GPU layers, so with
them (and a few other optional imports) stubbed, `read_run_config`, `load_model_config`,
`load_tokenizer` and `build_and_load_model(use_cpu_init=True)` run on a CPU, and so does its importer
(`import_with_bridge`: `AutoBridge.import_ckpt`'s steps, with the provider's GPU-only settings off).

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
    # megatron-core first, with the GPT model's modules: their optional-import probes must see no stubs
    import megatron.core
    import megatron.core.models.gpt.gpt_layer_specs
    import megatron.core.models.gpt.gpt_model
    import megatron.core.transformer.attention

    for name in _STUBBED_PACKAGES:
        sys.modules.pop(name, None)
    sys.meta_path.insert(0, _StubFinder())
    import megatron

    sys.path.insert(0, str(source))
    megatron.__path__.append(str(source / "megatron"))  # a namespace package: megatron.bridge joins it


def check_with_bridge(iter_dir: Path, out: Path) -> None:
    """Read a Bridge-layout iteration directory with Megatron-Bridge's own loaders; write what they saw.

    `out` gets a torch file: the run config Bridge read, the provider's fields, the tokenizer's
    vocabulary size and ids for a text, and the model state dict Bridge loaded (build_and_load_model
    on the CPU, with the local layer spec: Transformer Engine is stubbed).
    """
    import torch

    source = bridge_source()
    if isinstance(source, str):
        raise SystemExit(source)
    import_bridge(source)
    from megatron.bridge.models.gpt_provider import local_layer_spec
    from megatron.bridge.training.model_load_save import build_and_load_model, load_model_config, load_tokenizer
    from megatron.bridge.training.utils.checkpoint_utils import get_hf_model_id_from_checkpoint, read_run_config

    run_config = read_run_config(str(iter_dir / "run_config.yaml"))
    model_cfg, mlm_args = load_model_config(str(iter_dir))
    assert mlm_args is None, "Bridge read the checkpoint as a Megatron-LM one"
    fields = {
        name: getattr(model_cfg, name)
        for name in (
            "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
            "kv_channels", "seq_length", "vocab_size", "should_pad_vocab", "make_vocab_size_divisible_by",
            "normalization", "layernorm_epsilon", "gated_linear_unit", "position_embedding_type", "rotary_base",
            "rope_scaling", "rope_scaling_factor", "share_embeddings_and_output_weights", "add_bias_linear",
            "bf16",
        )
    }  # fmt: skip
    fields["activation_func"] = f"{model_cfg.activation_func.__module__}.{model_cfg.activation_func.__name__}"
    fields["params_dtype"] = str(model_cfg.params_dtype)
    tokenizer = load_tokenizer(str(iter_dir), tokenizer_model=str(iter_dir / "tokenizer"))
    model_cfg.transformer_layer_spec = local_layer_spec  # the same weights; TE is stubbed here
    model_cfg.gradient_accumulation_fusion = False
    model_cfg.masked_softmax_fusion = False
    model_cfg.bias_activation_fusion = False
    model_cfg.bias_dropout_fusion = False
    model_cfg.apply_rope_fusion = False
    model_cfg.persist_layer_norm = False
    state = build_and_load_model(str(iter_dir), model_cfg, return_state_dict=True, use_cpu_init=True)
    torch.save(
        {
            "run_config_model_target": run_config["model"]["_target_"],
            "fields": fields,
            "hf_model_id": get_hf_model_id_from_checkpoint(str(iter_dir.parent)),
            "tokenizer_vocab_size": tokenizer.vocab_size,
            "tokenizer_ids": list(tokenizer.tokenize("Grüße, Megatron!")),
            "state_dict": {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)},
        },
        out,
    )


# The provider's settings that name CUDA kernels (Transformer Engine's fused RoPE, apex's fused norms...):
# megatron-core refuses them without TE; off, the same weights compute the same function unfused.
_GPU_FUSIONS = (
    "gradient_accumulation_fusion",
    "masked_softmax_fusion",
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "apply_rope_fusion",
    "persist_layer_norm",
)


def _transformers_4_rope_names(config: Any) -> None:
    """Give a transformers 5 config the RoPE attributes transformers 4 had (`rope_theta`, `rope_scaling`).

    Megatron-Bridge 0.3.1 requires transformers < 5 and reads those two (model_bridge.py CONFIG_MAPPING and
    its rope_scaling handling); transformers 5 keeps them in `rope_parameters` only, so under 5 Bridge would
    silently build every model with its default RoPE base (10000). ckpteval pins transformers 5.
    """
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or getattr(config, "rope_theta", None) is not None:
        return
    config.rope_theta = params["rope_theta"]
    scaled = params.get("rope_type", "default") != "default"
    config.rope_scaling = {k: v for k, v in params.items() if k != "rope_theta"} if scaled else None


def import_with_bridge(hf_dir: Path, out: Path) -> None:
    """Write the Hugging Face model at `hf_dir` as a Megatron checkpoint at `out` with Megatron-Bridge's importer.

    The steps of `AutoBridge.import_ckpt` (0.3.1, models/conversion/auto_bridge.py:729-744): `from_hf_pretrained`,
    the provider with the weights loaded by Bridge's own parameter mappings (`to_megatron_provider`),
    `provide_distributed_model(use_cpu_initialization=True)` and `save_megatron_model(low_memory_save=True)`
    with the model's directory as the tokenizer. One call of `import_ckpt` cannot run here, and these are the
    only changes: the Hugging Face config gets transformers 4's RoPE attribute names (Bridge 0.3.1 requires
    transformers < 5: `_transformers_4_rope_names`), the provider's layer spec is megatron-core's local one
    and its fusion flags are off (TE is stubbed: `finalize` refuses apply_rope_fusion without it), the
    one-rank world is gloo (its `provide_distributed_model` would start nccl), and megatron-core's CPU patches
    (`server.cpu`) apply. The checkpoint's CUDA RNG state is read and dropped (`save_rng=False`), so it reads
    the CPU one instead.
    Call in a process of its own: it starts a world, and its writer spawns processes that re-import __main__.
    """
    import socket

    import torch
    import torch.distributed as dist

    source = bridge_source()
    if isinstance(source, str):
        raise SystemExit(source)
    import_bridge(source)
    from megatron.core import parallel_state

    from ckpteval.server.cpu import apply_cpu_patches

    apply_cpu_patches()
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()  # type: ignore[assignment]
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://localhost:{port}", world_size=1, rank=0)
    parallel_state.initialize_model_parallel()
    from megatron.bridge import AutoBridge
    from megatron.bridge.models.gpt_provider import local_layer_spec

    bridge = AutoBridge.from_hf_pretrained(str(hf_dir))
    _transformers_4_rope_names(bridge.hf_pretrained.config)
    provider = bridge.to_megatron_provider(load_weights=True)
    provider.transformer_layer_spec = local_layer_spec
    for flag in _GPU_FUSIONS:
        setattr(provider, flag, False)
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
    bridge.save_megatron_model(model, str(out), hf_tokenizer_path=str(hf_dir), low_memory_save=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "import":  # python -m tests.support.megatron_bridge import HF_DIR OUT
        import_with_bridge(Path(sys.argv[2]), Path(sys.argv[3]))
    else:  # python -m tests.support.megatron_bridge ITER_DIR OUT
        check_with_bridge(Path(sys.argv[1]), Path(sys.argv[2]))
