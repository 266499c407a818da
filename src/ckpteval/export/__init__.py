"""Results to W&B and MLflow, and W&B model artifacts to checkpoint paths (see docs/export.md).

- `invocation`: `export_invocation` (after a run, and `evaluate export` through `ckpteval.api.export`)
- `destinations`: the registry of destinations (W&B, MLflow): each one's config section, writer and curve writer
- `content`, `context`: what every destination gets (metrics `<task>/<metric>`, config, files; the key and
  environment; a watch run's curves)
- `to_wandb`, `to_mlflow`: the two destinations (an invocation's run, a watch run's curves)
- `credentials`: the W&B key (environment or `wandb login`) and the owner-only key file for jobs
- `job`: the pieces a detached cluster job needs (`stage_wandb_key`, `export_step_command`);
  `python -m ckpteval.export` is the step itself
- `artifacts`: `${art:model,path}` for `run.model=name:alias`

Nothing here imports wandb or mlflow at module level: they load only when an export or a lookup runs.
"""
