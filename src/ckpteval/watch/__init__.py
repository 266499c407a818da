"""`evaluate watch`: evaluate each checkpoint of a running Megatron training as it is saved.

`readiness` says which iterations of a save directory are completely written (one listing command per
poll, here or over SSH); `state` is the watch run's record on disk (survives restarts); `submit` is the
one seam to the evaluation pipeline; `loop` decides what to evaluate next; `curves` turns the results
into one W&B / MLflow run with a point per iteration, a table and a plot.
"""
