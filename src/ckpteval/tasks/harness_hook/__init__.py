"""The hook directory put first on the task client's PYTHONPATH (see `sitecustomize.py`).

Its modules are self-contained (standard library, plus `datasets`/`evaluate` when the harness uses
them) because they run inside the harness's processes, locally or in an eval-factory container.
ckpteval imports them as `ckpteval.tasks.harness_hook.<module>` for provenance and tests.
"""
