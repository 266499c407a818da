"""ckpteval: benchmark scores for a trained Megatron checkpoint.

The command-line tool `evaluate` is a thin layer over the functions exported here.
Heavy dependencies (torch, megatron, nemo_run, wandb) are imported only where they are used.
"""

from ckpteval.errors import (
    CkptevalError,
    ClusterError,
    ConfigError,
    DeploymentError,
    EvaluationError,
    ExportError,
)

__all__ = [
    "CkptevalError",
    "ClusterError",
    "ConfigError",
    "DeploymentError",
    "EvaluationError",
    "ExportError",
]
__version__ = "0.1.0"
