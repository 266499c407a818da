"""The builtin server, which runs inside the job: a megatron-core model behind an OpenAI-compatible API
(`python -m ckpteval.server serve`), its engine, router and prefix cache, and the building of models it
serves (the packaged ones included).

Light to import: torch and megatron load when a model does.
"""
