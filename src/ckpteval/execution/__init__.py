"""Where a job runs and how it is followed: one job-backend interface (`backend`) with its two
implementations (`local`, `slurm`), the typed invocation record (`record`), the job-directory layout
(`jobdir`), snapshots of a job's state (`snapshot`), the one mapping of a job's end to a state
(`state`), and the events the library reports (`events`). See docs/architecture.md.
"""
