"""Generation backends other than `model.generate` (vLLM: `trl_marl.generation.vllm_backend`).

Importing this package never imports vLLM: the backend module loads it only when a trainer asks for it.
"""
