"""Distributed helpers: DeepSpeed ZeRO-3 (`zero3`), FSDP2 (`fsdp`), keeping ranks with uneven work in step
(`collective`) and the per-rank memory estimate (`memory`, also `python -m trl_marl.distributed.memory`)."""
