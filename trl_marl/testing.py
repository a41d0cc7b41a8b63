"""Tiny, randomly initialised causal LMs and tokenizers built locally, with no network.

Tests, recipes' default runs and benchmarks use these instead of Hub checkpoints. Everything is written with
`save_pretrained` into a cache folder, so the real loading path (`from_pretrained(path)`) is what gets exercised.

```python
from trl_marl.testing import tiny_model_path
path = tiny_model_path()  # ~/.cache/trl_marl/tiny/llama-v512-h64-l2-seed0-ae67d397
model = AutoModelForCausalLM.from_pretrained(path)
```

The folder name is `TinyModelSpec.key()`: architecture, vocabulary, hidden size, layers and seed, then the first 8 hex
digits of a SHA-1 of every spec field (so specs that differ elsewhere never share a folder). `$TRL_MARL_CACHE`
replaces `~/.cache/trl_marl`.

The build is deterministic per (architecture, size, seed): the tokenizer is trained on a fixed synthetic corpus and
the weights are drawn after `torch.manual_seed(seed)`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "TinyModelSpec",
    "build_tiny_tokenizer",
    "build_tiny_model",
    "tiny_model_path",
    "cache_dir",
    "prompt_seeded_generation",
]

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, EOS_TOKEN, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "the a an and or but if then so of to in on at by for with from as is are was were be been it this that "
    "these those we you they he she i me my our your their story write short long summary summarize expand "
    "draft outline editor writer helper coder function return value list dict string number count sum max min "
    "sort filter map reduce test assert print def class import yield lambda true false none agent team reward "
    "plan task answer question reply first second third one two three four five six seven eight nine ten "
    "red green blue cat dog bird tree river mountain city house door window light dark day night sun moon "
    "star rain snow wind fire water earth stone gold silver paper book word line page chapter title name "
    "good bad big small new old fast slow high low hot cold happy sad early late open close begin end"
).split()


def cache_dir() -> Path:
    """Root of the local model cache: `$TRL_MARL_CACHE` or `~/.cache/trl_marl`."""
    root = os.environ.get("TRL_MARL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trl_marl")
    return Path(root)


def _corpus(seed: int = 1234, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(4, 14)
        words = [rng.choice(_WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 999)))
        line = " ".join(words)
        if rng.random() < 0.5:
            line = line.capitalize() + rng.choice([".", "!", "?", ":", ","])
        if rng.random() < 0.15:
            line = f"def {rng.choice(_WORDS)}(x):\n    return x + {rng.randint(0, 9)}"
        out.append(line)
    return out


def build_tiny_tokenizer(vocab_size: int = 512):
    """Train a byte-level BPE tokenizer on a fixed synthetic corpus and wrap it for transformers.

    Special tokens: `<|pad|>` (id 0, padding), `<|endoftext|>` (id 1, EOS), `<|im_start|>` / `<|im_end|>` (chat),
    with a ChatML chat template. Padding side is left, as generation wants. Any unicode string round-trips.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=None,
        additional_special_tokens=[IM_START, IM_END],
        padding_side="left",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny model. The default is the benchmark's reference shape C0 (a tiny Llama)."""

    architecture: str = "llama"  # "llama" or "qwen2"
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 1024
    seed: int = 0

    def key(self) -> str:
        digest = hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:8]
        return (
            f"{self.architecture}-v{self.vocab_size}-h{self.hidden_size}-l{self.num_hidden_layers}"
            f"-seed{self.seed}-{digest}"
        )


def build_tiny_model(spec: TinyModelSpec, tokenizer=None):
    """Build a randomly initialised causal LM of shape `spec` (deterministic per `spec.seed`)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    if tokenizer is None:
        tokenizer = build_tiny_tokenizer(spec.vocab_size)
    vocab = max(spec.vocab_size, len(tokenizer))
    common = dict(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    if spec.architecture == "llama":
        config = LlamaConfig(**common)
    elif spec.architecture == "qwen2":
        config = Qwen2Config(**common)
    else:
        raise ValueError(f"TinyModelSpec.architecture must be 'llama' or 'qwen2', got {spec.architecture!r}")
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model, tokenizer


def tiny_model_path(spec: TinyModelSpec | None = None, **overrides) -> str:
    """Return the folder of a tiny model + tokenizer, building and saving it on first use.

    Keyword overrides are `TinyModelSpec` fields (e.g. `tiny_model_path(seed=1, architecture="qwen2")`). The folder
    is written to a temporary sibling and renamed into place, so concurrent processes never see half a model.
    """
    spec = spec or TinyModelSpec()
    if overrides:
        spec = TinyModelSpec(**{**asdict(spec), **overrides})
    target = cache_dir() / "tiny" / spec.key()
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer = build_tiny_model(spec)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first; its copy is identical (deterministic build).
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def prompt_seeded_generation(trainer):
    """Make the trainer's generation engine (`trainer.generation`, what every rollout of the trainer samples with)
    sample each prompt's completions from a seed of its own (a hash of the agents' prompts for that index and the
    training step), one `generate` call per prompt index: what a prompt gets then depends only on the weights, the
    prompt and the step, not on the batch it is in nor on the process. With it, N processes that each roll out a
    share of the items sample what one process rolling out every item samples (the equivalence tests of data
    parallelism). Returns the trainer."""
    import zlib

    import torch

    from trl_marl.data_types.rollout import GenerationOutput

    original = trainer.generation.generate

    def generate(prompts_per_agent, num_generations, greedy=False):
        outs = [GenerationOutput([], [], []) for _ in prompts_per_agent]
        for k in range(len(prompts_per_agent[0])):
            key = "|".join(str(p[k]) for p in prompts_per_agent) + f"|{trainer.state.global_step}"
            torch.manual_seed(zlib.crc32(key.encode()))
            for o, g in zip(outs, original([[p[k]] for p in prompts_per_agent], num_generations, greedy)):
                o.texts += g.texts
                o.prompt_ids += g.prompt_ids
                o.completion_ids += g.completion_ids
        return outs

    trainer.generation.generate = generate
    return trainer
