"""What a checkpoint is, read before anything runs: `describe_checkpoint(path)` (also `evaluate inspect`).

It reads only the small files of a checkpoint (the tracker, `common.pt`'s args or Megatron-Bridge's
`run_config.yaml`, the torch_dist tensor index, the tokenizer's files), never its weights, and returns a
typed description: the layout, the model family and every setting that changes the forward pass, the
parallelism it was saved with, its dtype and size, its tokenizer, and for each backend whether it can serve
it and the memory per GPU that needs. `refusal(description, backend)` is the one message a run gets when the
backend it chose cannot serve the checkpoint: it is raised before any side effect.

Imports neither torch nor megatron (`checkpoint.torchfiles` reads the torch files), so a dry run stays quick.
"""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ckpteval.checkpoint.layout import DCP_METADATA_FILE, locate_checkpoint
from ckpteval.errors import DeploymentError

if TYPE_CHECKING:
    from ckpteval.checkpoint.identity import CheckpointIdentity
    from ckpteval.checkpoint.origin import OriginCheck
    from ckpteval.checkpoint.unexpected_tensors import UnexpectedTensors
    from ckpteval.config.preview import PreviewPanel

BackendName = Literal["builtin-cpu", "builtin-gpu", "export-deploy", "vllm", "sglang"]
BACKENDS: tuple[BackendName, ...] = ("builtin-cpu", "builtin-gpu", "export-deploy", "vllm", "sglang")
HF_CONFIG_FILE = "config.json"
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# what serving adds to the weights: the KV cache and activations of a batch, allocator slack
SERVING_HEADROOM = 1.2
# forward-changing args that also shape the weights (the load's shape check catches a wrong one): shown in
# `architecture`, not listed as settings
_SIZES = frozenset(
    (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "group_query_attention",
        "kv_channels",
        "ffn_hidden_size",
        "padded_vocab_size",
        "max_position_embeddings",
        "seq_length",
        "untie_embeddings_and_output_weights",
    )
)
_MODEL_KEY_SKIP = ("optimizer", "rng_state", "_extra_state", "rerun_state")


@dataclass(frozen=True)
class Parallelism:
    """The parallel sizes a checkpoint was saved with; None where nothing recorded says (args without the
    sizes: the tensor index shows TP alone)."""

    tensor: int | None = 1
    pipeline: int | None = 1
    expert: int | None = 1
    virtual_pipeline: int | None = None

    def __str__(self) -> str:
        def size(value: int | None) -> str:
            return "?" if value is None else str(value)

        text = f"TP={size(self.tensor)} PP={size(self.pipeline)} EP={size(self.expert)}"
        return text + (f" VP={self.virtual_pipeline}" if self.virtual_pipeline else "")


@dataclass(frozen=True)
class BackendVerdict:
    """Whether one backend can serve the checkpoint, why not, and what it needs."""

    backend: BackendName
    can_serve: bool
    reason: str  # why it cannot, or how it serves it
    hint: str = ""  # what to use instead
    memory_per_gpu: int | None = None  # bytes (per process on the CPU)
    settings: dict[str, str] = field(default_factory=dict)  # e.g. export-deploy's model_type


@dataclass(frozen=True)
class ForwardSetting:
    """One setting of the checkpoint that changes the forward pass, and whether the builtin honours it."""

    name: str
    value: Any
    status: str  # "served" or "refused"
    why: str = ""


@dataclass(frozen=True)
class TokenizerDescription:
    """The tokenizer a checkpoint names and whether it can be used."""

    kind: str
    origin: str  # where it was found (an override, the directory beside the checkpoint, the args)
    files: dict[str, str]
    hub_id: str | None = None
    problem: str | None = None
    hint: str | None = None
    sha256: str | None = None  # of its files (`tokenizer_sha256`), when they are here


@dataclass(frozen=True)
class CheckpointDescription:
    """A checkpoint as ckpteval understands it (see the module docstring)."""

    path: str
    layout: str  # "megatron-lm", "megatron-bridge" or "huggingface"
    format: str  # "torch_dist", "torch" (legacy, mp_rank_*) or "safetensors"
    iteration: int | None
    family: str
    architecture: dict[str, Any]  # the ModelArchitecture's fields, when the builtin can build the model
    forward_settings: tuple[ForwardSetting, ...]
    saved_parallelism: Parallelism
    trained_dtype: str
    parameters: int
    weight_bytes: int
    tokenizer: TokenizerDescription | None
    hf_model_id: str | None
    backends: tuple[BackendVerdict, ...]
    problems: tuple[str, ...] = ()  # what keeps the builtin from building the model, in words
    origin: OriginCheck | None = None  # the checkpoint compared with the Hugging Face model it came from
    identity: CheckpointIdentity | None = None  # hashes of its metadata files and of its file list
    # tensors in its index that the model its args build does not have, by the arg that would build them
    unexpected_tensors: tuple[UnexpectedTensors, ...] = ()

    def verdict(self, backend: BackendName) -> BackendVerdict:
        """The verdict for one backend."""
        return next(v for v in self.backends if v.backend == backend)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what `evaluate inspect --json` prints)."""
        data = dataclasses.asdict(self)
        data["saved_parallelism"] = dataclasses.asdict(self.saved_parallelism)
        return data


def describe_checkpoint(
    path: str | Path, *, tokenizer: str | None = None, origin: str | None = None
) -> CheckpointDescription:
    """Describe the checkpoint at `path` (a Megatron root or iteration directory, or a Hugging Face model
    directory) without loading its weights. `tokenizer` is `deployment.tokenizer` when the user set it,
    `origin` `deployment.origin` (see `ckpteval.checkpoint.origin`: the model it came from, compared with its args).

    Raises DeploymentError when `path` is not a checkpoint at all (missing, a file, an unknown layout), or
    `origin` names no Hugging Face model.
    """
    root = Path(path).expanduser()
    if root.is_dir() and (root / HF_CONFIG_FILE).is_file() and not _looks_megatron(root):
        return _describe_hf(root)
    layout = locate_checkpoint(root)
    description = _describe_megatron(layout, tokenizer=tokenizer)
    if not description.architecture:
        return description
    from ckpteval.checkpoint.origin import check_origin, find_origin

    found = find_origin(origin=origin, tokenizer=tokenizer, hf_model_id=description.hf_model_id)
    if found is None:
        return description
    return dataclasses.replace(description, origin=check_origin(description.architecture, *found))


def _looks_megatron(path: Path) -> bool:
    return any(
        (path / name).exists() for name in ("latest_checkpointed_iteration.txt", "latest_train_state.pt", "common.pt")
    )


def _describe_megatron(layout: Any, *, tokenizer: str | None) -> CheckpointDescription:
    from ckpteval.checkpoint.architecture import ModelArchitecture
    from ckpteval.checkpoint.args import EMBEDDING_KEY, read_training_args
    from ckpteval.checkpoint.identity import checkpoint_identity

    args, kind, hf_id = read_training_args(layout)
    tensors = _legacy_tensors(layout.iter_dir) if layout.ckpt_format == "torch" else _tensor_index(layout.iter_dir)
    vocab = tensors.get(EMBEDDING_KEY, ((None,), ""))[0][0]
    problems: list[str] = []
    hints: list[str] = []
    architecture: dict[str, Any] = {}
    try:
        arch = ModelArchitecture.from_args(args, where=str(layout.iter_dir), vocab_from_weights=vocab)
        architecture = dataclasses.asdict(arch)
    except DeploymentError as exc:
        problems.append(exc.message)
        hints.append(exc.hint or "")
    token = _describe_tokenizer(args, layout, tokenizer)
    if not token.problem and architecture:
        token = _check_vocab(token, int(architecture["padded_vocab_size"]), str(layout.iter_dir))
    if token.problem:
        problems.append(token.problem)
        hints.append(
            "Set deployment.tokenizer=DIR (a Hugging Face tokenizer directory) or a hub id in the local cache."
        )
    trained = "bfloat16" if getattr(args, "bf16", False) else "float16" if getattr(args, "fp16", False) else "float32"
    parameters = sum(_numel(shape) for shape, _ in tensors.values())
    weight_bytes = sum(_numel(shape) * _itemsize(dtype) for shape, dtype in tensors.values())
    saved = saved_parallelism(args, layout.iter_dir)
    unexpected: tuple[UnexpectedTensors, ...] = ()
    if architecture:
        from ckpteval.checkpoint.unexpected_tensors import unexpected_in_index

        unexpected = unexpected_in_index(architecture, tensors)
    family = _family(args)
    builtin_ok = not problems
    description = CheckpointDescription(
        path=str(layout.iter_dir),
        layout=kind,
        format=layout.ckpt_format,
        iteration=layout.iteration,
        family=family,
        architecture=architecture,
        forward_settings=_forward_settings(args),
        saved_parallelism=saved,
        trained_dtype=trained,
        parameters=parameters,
        weight_bytes=weight_bytes,
        tokenizer=token,
        hf_model_id=hf_id,
        backends=(
            _builtin_verdict("builtin-cpu", builtin_ok, problems, hints, parameters, "float32"),
            _builtin_verdict("builtin-gpu", builtin_ok, problems, hints, parameters, trained),
            _export_deploy_verdict(family, parameters, trained, saved, token),
            *_engine_verdicts(architecture, str(layout.iter_dir), parameters, trained),
        ),
        problems=tuple(problems),
        identity=checkpoint_identity(layout.iter_dir),
        unexpected_tensors=unexpected,
    )
    return description


def _engine_verdicts(
    architecture: dict[str, Any], where: str, parameters: int, dtype: str
) -> tuple[BackendVerdict, BackendVerdict]:
    """vLLM and SGLang serve Hugging Face directories: a Megatron checkpoint through the job's export step
    (`ckpteval.job.hf_export`: exported once per checkpoint content, parity-checked before the engine
    starts), when a Hugging Face family computes its architecture; else not, and why."""
    from ckpteval.checkpoint.hf_export_config import export_verdict

    family, via_export = export_verdict(architecture, where=where)
    if family is None:
        reason = f"vLLM and SGLang serve Hugging Face directories, not this Megatron checkpoint; {via_export}"
        hint = "Use deployment=megatron (builtin or export-deploy)."
        return BackendVerdict("vllm", False, reason, hint=hint), BackendVerdict("sglang", False, reason, hint=hint)
    memory = int(parameters * _DTYPE_BYTES.get(dtype, 2) * SERVING_HEADROOM)
    reason = (
        f"via its Hugging Face export ({via_export}): the job exports it (or reuses the export of the same "
        "content) and checks parity before the engine starts"
    )
    return (
        BackendVerdict("vllm", True, reason, memory_per_gpu=memory),
        BackendVerdict("sglang", True, reason, memory_per_gpu=memory),
    )


_ENGINES: tuple[tuple[BackendName, str], ...] = (("vllm", "vLLM"), ("sglang", "SGLang"))


def _describe_hf(root: Path) -> CheckpointDescription:
    try:
        config = json.loads((root / HF_CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DeploymentError(f"{root / HF_CONFIG_FILE} cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise DeploymentError(f"{root / HF_CONFIG_FILE} does not hold a JSON object.")
    family = ", ".join(config.get("architectures") or []) or str(config.get("model_type", "unknown"))
    weights = sorted(p.name for p in root.glob("*.safetensors")) + sorted(p.name for p in root.glob("*.bin"))
    trained = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    size = sum((root / name).stat().st_size for name in weights)
    megatron_hint = (
        "The builtin server and Export-Deploy serve Megatron checkpoints; use deployment=vllm for this directory."
    )
    no_megatron = f"{root} is a Hugging Face checkpoint (config.json), not a Megatron one."
    return CheckpointDescription(
        path=str(root),
        layout="huggingface",
        format="safetensors" if any(w.endswith(".safetensors") for w in weights) else "pytorch",
        iteration=None,
        family=family,
        architecture={},
        forward_settings=(),
        saved_parallelism=Parallelism(),
        trained_dtype=trained,
        parameters=size // _DTYPE_BYTES.get(trained, 2),
        weight_bytes=size,
        tokenizer=TokenizerDescription(
            kind="HuggingFaceTokenizer", origin="the model directory", files={"directory": str(root)}
        ),
        hf_model_id=None,
        backends=(
            BackendVerdict("builtin-cpu", False, no_megatron, hint=megatron_hint),
            BackendVerdict("builtin-gpu", False, no_megatron, hint=megatron_hint),
            BackendVerdict("export-deploy", False, no_megatron, hint=megatron_hint),
            *(
                BackendVerdict(
                    engine,
                    bool(weights),
                    f"{name} loads it as it is" if weights else f"{root} has config.json but no weights.",
                    memory_per_gpu=int(size * SERVING_HEADROOM) if weights else None,
                )
                for engine, name in _ENGINES
            ),
        ),
        problems=() if weights else (f"{root} has config.json but no *.safetensors or *.bin weights.",),
    )


def _tensor_index(iter_dir: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Model tensor name -> (global shape, dtype name), from the torch_dist index (no weights read)."""
    from ckpteval.checkpoint.torchfiles import read_tensor_index

    if not (iter_dir / DCP_METADATA_FILE).is_file():
        return {}
    return {
        key: value
        for key, value in read_tensor_index(iter_dir / DCP_METADATA_FILE).items()
        if not any(skip in key for skip in _MODEL_KEY_SKIP)
    }


def _legacy_tensors(iter_dir: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, dtype) of a legacy `torch` checkpoint's model state (its pickle only)."""
    from ckpteval.checkpoint.layout import legacy_state_file
    from ckpteval.checkpoint.torchfiles import TensorStandIn, read_torch_save

    path = legacy_state_file(iter_dir)
    model = read_torch_save(path).get("model") if path else None
    if not isinstance(model, dict):
        return {}
    return {
        str(key): (value.shape, value.dtype or "float32")
        for key, value in model.items()
        if isinstance(value, TensorStandIn) and "_extra_state" not in str(key)
    }


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _itemsize(dtype: str) -> int:
    return _DTYPE_BYTES.get(dtype, 4)


def saved_parallelism(args: Any, iter_dir: Path) -> Parallelism:
    """TP, PP, EP (and VP) a checkpoint was saved with, from Megatron-LM's args; args without the sizes fall
    back to the torch_dist index, which shows TP only (the vocabulary-parallel embedding is stored one chunk
    per TP rank; layers and experts leave no trace of PP or EP). Reads no weights, imports no torch."""

    def size(name: str) -> int:
        value = getattr(args, name, None)
        return int(value) if isinstance(value, int) and value > 0 else 1

    vp = getattr(args, "virtual_pipeline_model_parallel_size", None)
    virtual = int(vp) if isinstance(vp, int) and vp > 1 else None
    if isinstance(getattr(args, "tensor_model_parallel_size", None), int):
        return Parallelism(
            tensor=size("tensor_model_parallel_size"),
            pipeline=size("pipeline_model_parallel_size"),
            expert=size("expert_model_parallel_size"),
            virtual_pipeline=virtual,
        )
    from ckpteval.checkpoint.args import EMBEDDING_KEY
    from ckpteval.checkpoint.torchfiles import read_chunk_offsets

    index = iter_dir / DCP_METADATA_FILE
    offsets = read_chunk_offsets(index, EMBEDDING_KEY) if index.is_file() else []
    tensor = len({o[0] for o in offsets if o}) or None
    return Parallelism(tensor=tensor, pipeline=None, expert=None, virtual_pipeline=virtual)


def _family(args: Any) -> str:
    def get(name: str) -> Any:
        return getattr(args, name, None)

    if get("hybrid_override_pattern") or get("hybrid_layer_pattern") or get("is_hybrid_model"):
        return "hybrid Mamba (Nemotron-H style)"
    if get("multi_latent_attention"):
        return "multi-latent attention (DeepSeek style)" + (", MoE" if get("num_experts") else "")
    moe = f"MoE ({get('num_experts')} experts, top-{get('moe_router_topk') or 2})" if get("num_experts") else ""
    if get("squared_relu") and get("apply_layernorm_1p"):
        base = "Nemotron-4"
    elif get("swiglu") and get("normalization") == "RMSNorm":
        base = "Llama-style GPT"
    else:
        base = "GPT"
    return f"{base} {moe}".strip() if moe else base


def _forward_settings(args: Any) -> tuple[ForwardSetting, ...]:
    """Every forward-changing arg the checkpoint sets away from its default, with the builtin's status."""
    from ckpteval.checkpoint.forward_args import FORWARD_ARGS

    out = []
    for name, entry in FORWARD_ARGS.items():
        if not hasattr(args, name) or entry.status == "no-effect" or name in _SIZES:
            continue
        value = getattr(args, name)
        if entry.is_harmless(value):
            continue
        out.append(ForwardSetting(name=name, value=_plain(value), status=entry.status, why=entry.why))
    return tuple(out)


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _describe_tokenizer(args: Any, layout: Any, override: str | None) -> TokenizerDescription:
    from ckpteval.checkpoint.tokenizer_source import tokenizer_sha256, tokenizer_source

    source = tokenizer_source(args, layout, override)
    present = bool(source.files) and all(p.exists() for p in source.files.values())
    return TokenizerDescription(
        kind=source.kind,
        origin=source.origin,
        files={role: str(p) for role, p in source.files.items()},
        hub_id=source.hub_id,
        problem=source.problem,
        hint=source.hint,
        sha256=tokenizer_sha256(source.files) if present else None,
    )


def _check_vocab(token: TokenizerDescription, padded_vocab: int, where: str) -> TokenizerDescription:
    """The tokenizer with a problem when it can produce ids past the model's embedding (checked where that is
    cheap: a Hugging Face directory's tokenizer.json; other kinds are checked when the server loads them)."""
    from ckpteval.checkpoint.tokenizer_source import check_vocab_fits

    directory = Path(token.files.get("directory", ""))
    if token.kind != "HuggingFaceTokenizer" or not (directory / "tokenizer.json").is_file():
        return token
    try:
        check_vocab_fits(directory, padded_vocab, where=where)
    except DeploymentError as exc:
        return dataclasses.replace(token, problem=exc.message, hint=exc.hint)
    return token


def _builtin_verdict(
    backend: BackendName, ok: bool, problems: list[str], hints: list[str], parameters: int, dtype: str
) -> BackendVerdict:
    where = "the CPU" if backend == "builtin-cpu" else "one GPU"
    memory = int(parameters * _DTYPE_BYTES.get(dtype, 4) * SERVING_HEADROOM)
    if ok:
        return BackendVerdict(backend, True, f"megatron-core on {where}, in {dtype}", memory_per_gpu=memory)
    hint = next((h for h in hints if h), "Use deployment.backend=export-deploy on a cluster.")
    return BackendVerdict(backend, False, problems[0], hint=hint, memory_per_gpu=memory)


def _export_deploy_verdict(
    family: str, parameters: int, dtype: str, saved: Parallelism, token: TokenizerDescription
) -> BackendVerdict:
    """Export-Deploy's in-framework deployment builds any megatron-core model its NeMo image knows; hybrid
    Mamba models need its `--model_type mamba` (deployment.model_type=mamba)."""
    hybrid = family.startswith("hybrid")
    settings = {"deployment.model_type": "mamba" if hybrid else "gpt"}
    shards = max(1, (saved.tensor or 1) * (saved.pipeline or 1))
    memory = int(parameters * _DTYPE_BYTES.get(dtype, 2) / shards * SERVING_HEADROOM)
    if token.problem:  # the task clients could not tokenize either
        hint = token.hint or "Set deployment.tokenizer to a Hugging Face tokenizer directory or hub id."
        return BackendVerdict("export-deploy", False, token.problem, hint=hint, memory_per_gpu=memory)
    reason = f"Export-Deploy (Ray, in the NeMo image) at the saved {saved} or any split megatron can reshard to"
    return BackendVerdict("export-deploy", True, reason, memory_per_gpu=memory, settings=settings)


def with_paths_replaced(description: CheckpointDescription, local: str, remote: str) -> CheckpointDescription:
    """The description with `local` (where a cluster checkpoint's small files were copied) read as `remote`."""

    def swap(text: str) -> str:
        return remote + text[len(local) :] if text.startswith(local) else text

    token = description.tokenizer
    if token is not None:
        token = dataclasses.replace(
            token,
            files={role: swap(p) for role, p in token.files.items()},
            problem=token.problem.replace(local, remote) if token.problem else None,
        )
    return dataclasses.replace(
        description,
        path=swap(description.path),
        tokenizer=token,
        problems=tuple(p.replace(local, remote) for p in description.problems),
        backends=tuple(
            dataclasses.replace(v, reason=v.reason.replace(local, remote), hint=v.hint.replace(local, remote))
            for v in description.backends
        ),
    )


def gib(size: int | None) -> str:
    """`size` bytes as GiB (or MiB when small), for people."""
    if size is None:
        return "?"
    if size < 1 << 30:
        return f"{size / (1 << 20):.1f} MiB"
    return f"{size / (1 << 30):.1f} GiB"


def backend_of(deployment: Any, *, on_cluster: bool) -> BackendName | None:
    """The backend a deployment config serves its checkpoint with (None: it serves no checkpoint of ours)."""
    from ckpteval.config.schema import MegatronDeployment, SglangDeployment, VllmDeployment

    if isinstance(deployment, MegatronDeployment):
        if deployment.backend == "export-deploy":
            return "export-deploy"
        if deployment.device == "cpu":
            return "builtin-cpu"
        return "builtin-gpu" if deployment.device == "cuda" or on_cluster else "builtin-cpu"
    if isinstance(deployment, (VllmDeployment, SglangDeployment)):
        return deployment.type if deployment.checkpoint_path and not deployment.hf_model_handle else None
    return None


def user_tokenizer(deployment: Any) -> str | None:
    """`deployment.tokenizer` when the user named one (None for the checkpoint's own: `from-checkpoint`, or the
    checkpoint's own path, vLLM's and SGLang's default)."""
    from ckpteval.config.schema import FROM_CHECKPOINT

    value = getattr(deployment, "tokenizer", None)
    checkpoint = str(getattr(deployment, "checkpoint_path", None) or "").rstrip("/")
    if value in (None, FROM_CHECKPOINT) or str(value).rstrip("/") == checkpoint:
        return None
    return str(value)


def clients_read(deployment: Any, checkpoint: str) -> str | None:
    """The tokenizer directory the task clients load that no deployment makes for them: the checkpoint's own
    `tokenizer/` with Export-Deploy and `deployment.tokenizer: from-checkpoint` (the builtin publishes one)."""
    from ckpteval.config.schema import MegatronDeployment

    mine = isinstance(deployment, MegatronDeployment) and deployment.backend == "export-deploy"
    if mine and user_tokenizer(deployment) is None:
        return f"{checkpoint.rstrip('/')}/tokenizer"
    return None


def refuse_unservable(
    description: CheckpointDescription, backend: BackendName, *, clients_read: str | None = None
) -> None:
    """Raise the one DeploymentError a run gets when `backend` cannot serve the described checkpoint.

    `clients_read`: the Hugging Face tokenizer directory the task clients will load when no one makes it
    for them (Export-Deploy's deployments publish none): it must be the checkpoint's own."""
    verdict = description.verdict(backend)
    if not verdict.can_serve:
        raise DeploymentError(
            f"The {backend} backend cannot serve {description.path}: {verdict.reason}",
            hint=verdict.hint or "Run `evaluate inspect PATH` to see which backends can serve it.",
        )
    token = description.tokenizer
    if clients_read is None or token is None:
        return
    directory = token.files.get("directory", "")
    if token.kind == "HuggingFaceTokenizer" and directory.rstrip("/") == clients_read.rstrip("/"):
        return
    raise DeploymentError(
        f"The task clients read the tokenizer from {clients_read}, which is not a Hugging Face tokenizer "
        f"directory: the checkpoint's tokenizer is {token.kind} (from {token.origin}), and with {backend} "
        "nothing converts it for them.",
        hint="Set deployment.tokenizer to a Hugging Face tokenizer directory (or hub id) of this model, or save "
        "one there; `evaluate deploy` / deployment.backend=builtin converts it by itself.",
    )


def refuse_origin_mismatch(description: CheckpointDescription, *, ignore: bool = False) -> None:
    """Raise the one DeploymentError a run gets when the checkpoint's args disagree with the Hugging Face
    model it came from (unless `ignore`: deployment.ignore_origin_mismatch)."""
    from ckpteval.checkpoint.origin import refuse_mismatch

    if description.origin is not None and not ignore:
        refuse_mismatch(description.origin, description.path)


def refuse_unexpected_tensors(description: CheckpointDescription, *, ignore: bool = False) -> None:
    """Raise the one DeploymentError a run gets when the checkpoint holds tensors the model its args build
    does not have (unless `ignore`: deployment.ignore_unexpected_tensors)."""
    from ckpteval.checkpoint.unexpected_tensors import refuse_unexpected

    if not ignore:
        refuse_unexpected(description.unexpected_tensors, description.path)


def headline(description: CheckpointDescription) -> str:
    """One line: family, size, dtype, saved parallelism."""
    d = description
    return (
        f"{d.family}, {d.parameters / 1e6:,.1f} M parameters ({gib(d.weight_bytes)}), {d.trained_dtype}, "
        f"saved with {d.saved_parallelism}"
    )


def summary(description: CheckpointDescription) -> str:
    """The description in a few lines of text (the dry run's checkpoint panel, `evaluate inspect`)."""
    d = description
    lines = [
        f"path          {d.path}",
        f"layout        {d.layout} ({d.format})" + (f", iteration {d.iteration}" if d.iteration is not None else ""),
        f"model         {d.family}, {d.parameters / 1e6:,.1f} M parameters, {gib(d.weight_bytes)} of weights",
        f"trained in    {d.trained_dtype}; saved with {d.saved_parallelism}",
    ]
    if d.hf_model_id:
        lines.append(f"started from  {d.hf_model_id} (Hugging Face)")
    if d.tokenizer is not None:
        files = ", ".join(f"{role}={path}" for role, path in d.tokenizer.files.items())
        lines.append(f"tokenizer     {d.tokenizer.kind}" + (f" ({files})" if files else ""))
        if d.tokenizer.problem:
            lines.append(f"              problem: {d.tokenizer.problem}")
    if d.architecture:
        from ckpteval.checkpoint.origin import forward_numbers, show_value

        numbers = forward_numbers(d.architecture)
        lines.append("forward       " + ", ".join(f"{k}={show_value(v)}" for k, v in numbers.items() if v is not None))
    if d.origin is not None:
        if d.origin.disagreements:
            lines.append(f"origin        {d.origin.origin} ({d.origin.config}) DISAGREES:")
            lines.extend(f"              {disagreement}" for disagreement in d.origin.disagreements)
        else:
            compared = ", ".join(d.origin.compared)
            lines.append(f"origin        {d.origin.origin} ({d.origin.config}) agrees on {compared}")
        if d.origin.not_compared:
            lines.append("              not compared: " + "; ".join(d.origin.not_compared))
    for group in d.unexpected_tensors:
        lines.append(f"unexpected    {group}")
    for setting in d.forward_settings:
        lines.append(
            f"setting       {setting.name}={setting.value!r}: {setting.status}"
            + (f" ({setting.why})" if setting.status != "served" and setting.why else "")
        )
    for verdict in d.backends:
        mark = "yes" if verdict.can_serve else "no "
        memory = f", ~{gib(verdict.memory_per_gpu)} per GPU" if verdict.can_serve and verdict.memory_per_gpu else ""
        if verdict.backend == "builtin-cpu" and verdict.can_serve:
            memory = f", ~{gib(verdict.memory_per_gpu)} of RAM"
        extra = "".join(f", {k}={v}" for k, v in verdict.settings.items())
        lines.append(f"{verdict.backend:<13} {mark} {verdict.reason}{memory}{extra}")
    return "\n".join(lines)


def checkpoint_panel(description: CheckpointDescription, backend: str) -> PreviewPanel:
    """The description as the run's preview shows it: headline and backend in the title, every detail in
    full by --dry-run."""
    from ckpteval.config.preview import PreviewPanel

    d = description
    return PreviewPanel(
        title=f"checkpoint, served by {backend}: {d.family}, {d.parameters / 1e6:,.1f} M parameters",
        body=summary(description),
        full_only_in_dry_run=True,
    )
