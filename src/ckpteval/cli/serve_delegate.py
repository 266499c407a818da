"""`evaluate serve-delegate`: the HTTP service RL training loops (slime) delegate evaluations to."""

from __future__ import annotations

# ckpteval modules imported inside functions are imported there for start-up speed (`evaluate --help`
# and `--dry-run` load only what they use), not to break an import cycle.
from pathlib import Path
from typing import Annotated

import typer


def _in_range(low: int, high: int | None):
    """An option callback: the value within [low, high], or the one-line usage error every bad flag gets."""

    def check(value: int) -> int:
        if value < low or (high is not None and value > high):
            raise typer.BadParameter(f"{value} is not in {low}..{high}" if high else f"{value} is less than {low}")
        return value

    return check


def serve_delegate_command(
    port: Annotated[
        int,
        typer.Option("--port", metavar="PORT", callback=_in_range(1, 65535), help="TCP port to listen on (1-65535)."),
    ] = 9050,
    host: Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0: every interface).")] = "0.0.0.0",
    max_concurrent_requests: Annotated[
        int,
        # the name is slime's protocol: its range is checked by a callback and named in the help, as a range
        # type would add "[x>=1]" to the type column and cut the name at 80 columns
        typer.Option(
            "--max-concurrent-requests",
            metavar="N",
            callback=_in_range(1, None),
            help="Most requests in flight toward the model (at least 1).",
        ),
    ] = 512,
    openai_model_name: Annotated[
        str, typer.Option("--openai-model-name", help="The model name sent to the router.")
    ] = "slime-openai-model",
    endpoint_type: Annotated[
        str, typer.Option("--endpoint-type", help="completions or chat: the router's route tasks use.")
    ] = "completions",
    output_root: Annotated[
        Path, typer.Option("--output-root", help="Where each rollout's invocations are written.")
    ] = Path("delegate-results"),
    config: Annotated[
        list[str] | None,
        typer.Option("-c", "--config", metavar="NAME|PATH", help="Base config(s) for every evaluation."),
    ] = None,
    env_file: Annotated[Path | None, typer.Option("--env-file", help="The env.toml to read profiles from.")] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[OVERRIDES]...",
            help="Hydra overrides for every evaluation (e.g. limit_samples).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve GET /health and POST /evaluate for a training loop: each request evaluates the model behind its
    router_url on its benchmarks and answers with eval/<benchmark>/<mode>/<metric> metrics.

      evaluate serve-delegate --port 9050 --max-concurrent-requests 512 --openai-model-name slime-openai-model
      evaluate serve-delegate evaluation.nemo_evaluator_config.config.params.limit_samples=200
    """
    import logging

    import ckpteval
    from ckpteval.types import DelegateSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = DelegateSettings(
        output_root=output_root.expanduser().resolve(),
        model_name=openai_model_name,
        max_concurrent_requests=max_concurrent_requests,
        endpoint_type=endpoint_type,  # type: ignore[arg-type]
        configs=tuple(config or ()),
        overrides=tuple(overrides or ()),
        env_file=env_file,
    )
    typer.echo(f"eval delegate: http://{host}:{port}  (POST /evaluate, GET /health; results in {settings.output_root})")
    ckpteval.serve_delegate(settings, host=host, port=port)
