"""Where a job runs and how it is followed: the one invocation pipeline (`pipeline`, handed a `planned` job),
the job-backend interface (`backend`) with its two implementations (`local`, `slurm`) resolved from the
executor registry (`backends`), snapshots of a job's state (`snapshot`), the one mapping of a job's end to a
state (`state`), and the events the library reports (`events`). See docs/architecture.md.
"""
