"""Test configuration: offline, single-threaded, tiny local models."""

import os

# Offline and quiet before anything imports transformers / huggingface_hub.
for _k, _v in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "CI": "1",  # TRL skips its telemetry ping on CI
    "WANDB_MODE": "disabled",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}.items():
    os.environ.setdefault(_k, _v)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_path() -> str:
    """Folder of the default tiny Llama (vocab 512, hidden 64, 2 layers) with its tokenizer."""
    from trl_marl.testing import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="session")
def tiny_qwen_path() -> str:
    from trl_marl.testing import tiny_model_path

    return tiny_model_path(architecture="qwen2", num_key_value_heads=2, seed=1)


@pytest.fixture
def tiny_tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


def cpu_args(config_cls, tmp_path, **overrides):
    """A config for fast CPU tests."""
    defaults = dict(
        output_dir=str(tmp_path / "out"),
        num_agents=2,
        num_generations=2,
        max_new_tokens=6,
        rollout_buffer_size=2,
        learning_rate=1e-3,
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        eval_num_samples=4,
        seed=0,
    )
    defaults.update(overrides)
    return config_cls(**defaults)


@pytest.fixture
def make_args(tmp_path):
    def _make(config_cls=None, **overrides):
        if config_cls is None:
            from trl_marl import MAGRPOConfig

            config_cls = MAGRPOConfig
        return cpu_args(config_cls, tmp_path, **overrides)

    return _make


@pytest.fixture
def items():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": f"Write about topic {i}.", "topic": str(i)} for i in range(8)])
