"""`use_vllm="auto"`: the documented rule (`trl_marl.generation.choice`) and the trainer applying it."""

import logging
from types import SimpleNamespace

import pytest

from trl_marl.generation.choice import choose_backend


def config(hidden=512, heads=8, head_dim=None):
    return SimpleNamespace(hidden_size=hidden, num_attention_heads=heads, head_dim=head_dim)


def args(**overrides):
    base = dict(parallel_training="none", share_base_model=False, vllm_enable_lora=True, max_completion_length=16)
    return SimpleNamespace(**{**base, **overrides})


@pytest.mark.parametrize(
    "settings, configs, device, version, use_vllm, reason",
    [
        ({}, [config()], "cpu", None, False, "vLLM is not installed"),
        ({"parallel_training": "mp"}, [config()], "cuda", "0.31.0", False, "parallel_training='mp'"),
        ({}, [config(128, 2)], "cuda", "0.31.0", True, "a CUDA device"),
        ({}, [config(64, 4)], "cpu", "0.31.0", False, "head_dim 16 < 32"),
        ({"share_base_model": True}, [config()], "cpu", "0.31.0", False, "shared-base LoRA team on CPU"),
        (
            {"share_base_model": True, "vllm_enable_lora": False, "max_completion_length": 256},
            [config()],
            "cpu",
            "0.31.0",
            True,
            "256 new tokens",
        ),
        ({}, [config(), config(128, 2)], "cpu", "0.31.0", False, "16 < 128 new tokens"),
        # hidden 512 at 16 tokens: vLLM 0.91x of generate (quiet machine); the old rule chose vLLM for any hidden >= 512
        ({}, [config(4096, 32)], "cpu", "0.31.0", False, "16 < 128 new tokens"),
        ({"max_completion_length": 128}, [config(128, 2)], "cpu", "0.31.0", True, "128 new tokens"),
        ({"max_completion_length": [16, 128]}, [config(128, 2)], "cpu", "0.31.0", True, "128 new tokens"),  # per agent
        ({}, [config()], "mps", "0.31.0", False, "no engine for the 'mps' device"),
    ],
)
def test_the_rule(settings, configs, device, version, use_vllm, reason):
    choice = choose_backend(args(**settings), configs, device, version)
    assert choice.use_vllm is use_vllm and reason in choice.reason


def test_the_trainer_applies_and_logs_the_choice(make_args, tiny_path, items, caplog, monkeypatch):
    """Without a usable vLLM (this venv) `auto` gives transformers' generate, says why, and `use_vllm` holds it."""
    import trl_marl.generation.vllm_backend as backend
    from trl_marl import MAGRPOTrainer
    from trl_marl.generation import HFGeneration

    def missing():
        raise ImportError("vLLM is not installed")

    monkeypatch.setattr(backend, "check_vllm_available", missing)
    with caplog.at_level(logging.INFO, logger="trl_marl.trainers.building"):
        trainer = MAGRPOTrainer(
            model=tiny_path, reward_funcs=lambda c1, c2: [0.0] * len(c1), args=make_args(use_vllm="auto"),
            train_dataset=items,
        )  # fmt: skip
    assert type(trainer.generation) is HFGeneration and trainer.args.use_vllm is False
    assert "use_vllm='auto': transformers, because vLLM is not installed" in caplog.text
