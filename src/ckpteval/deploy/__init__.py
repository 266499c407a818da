"""Deployments: the command line that starts each kind of deployment inside a job (`deployment.type`, and
megatron's backend), rendered on this machine before submission. What runs inside the job is elsewhere: the
builtin server in `ckpteval.server`, Export-Deploy, vLLM and generic commands in their images.
"""
