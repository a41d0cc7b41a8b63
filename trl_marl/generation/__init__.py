"""Generation engines: how a trainer samples completions for its team.

`GenerationEngine` is the interface a trainer calls (`generate`, `generate_with`); `HFGeneration` samples with
transformers' `generate`, `trl_marl.generation.vllm_backend.VLLMTeamGeneration` with colocated vLLM engines. Importing
this package never imports vLLM: the vLLM module loads it only when a trainer asks for it.
"""

from trl_marl.generation.engine import GenerationEngine, SamplingSettings
from trl_marl.generation.hf import HFGeneration

__all__ = ["GenerationEngine", "SamplingSettings", "HFGeneration"]
