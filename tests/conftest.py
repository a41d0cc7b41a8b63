"""Test configuration: offline, single-threaded, tiny local models."""

import os
import sys
import textwrap
import uuid

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
        max_completion_length=6,
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
    from trl_marl import MADPOConfig

    if issubclass(config_cls, MADPOConfig):  # it samples preference_num_candidates and refuses num_generations
        del defaults["num_generations"]
    defaults.update(overrides)
    return config_cls(**defaults)


def letters_reward(c1, c2):
    """A 2-agent team reward a tiny model can move: the number of vowels in the joint response."""
    return [float(sum(ch in "aeiou" for ch in a + b)) for a, b in zip(c1, c2)]


def iterative_args(tmp_path, config_cls, **overrides):
    """A config of an iterative trainer for fast CPU tests: two rounds; each test states what else differs."""
    defaults = dict(
        output_dir=str(tmp_path / "out"),
        learning_rate=1e-3,
        num_rounds=2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    defaults.update(overrides)
    return config_cls(**defaults)


def completions_read_as(trainer, texts, vary=False):
    """Make every completion of agent i read `texts[i]` (token ids as generated; `vary`: row r's text ends with r
    exclamation marks, so that rewards differ): text a tokenizer's decode never gives, as an engine, an API or a
    tool can hand back (lone surrogates: `"\\ud800"` escapes in JSON)."""
    import dataclasses

    generate = trainer.generation.generate

    def generate_as(prompts_per_agent, num_generations, greedy=False):
        outs = generate(prompts_per_agent, num_generations, greedy)
        rows = [[texts[i] + ("!" * r if vary else "") for r in range(len(o.texts))] for i, o in enumerate(outs)]
        return [dataclasses.replace(o, texts=r) for o, r in zip(outs, rows)]

    trainer.generation.generate = generate_as


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


# Settings of the learning tests: the tiny team on a built-in task, evaluated on the task's 16 held-out items.
LEARNING_SETTINGS = dict(
    num_generations=4,
    max_completion_length=16,
    rollout_buffer_size=8,
    learning_rate=3e-3,
    logging_steps=10,
    save_strategy="no",
    report_to="none",
    disable_tqdm=True,
    eval_num_samples=16,
    seed=0,
)


@pytest.fixture
def task_trainer(tmp_path, tiny_path):
    """`task_trainer(trainer_cls, config_cls, task_name, **config)` -> (trainer, eval reward before training): a
    trainer for the tiny team on the built-in task, with `LEARNING_SETTINGS` updated by `config`. Trainer-only
    arguments (`critic_model=...`) go in `trainer_kwargs`."""

    def build(trainer_cls, config_cls, task_name, trainer_kwargs=None, **config):
        from trl_marl import load_task

        task = load_task(task_name)
        trainer = trainer_cls(
            model=tiny_path,
            reward_funcs=task.reward_func,
            formatters=task.formatters,
            args=config_cls(output_dir=str(tmp_path), **{**LEARNING_SETTINGS, **config}),
            train_dataset=task.train_dataset,
            eval_dataset=task.eval_dataset,
            **(trainer_kwargs or {}),
        )
        return trainer, trainer.evaluate_reward()["eval_reward"]

    return build


@pytest.fixture
def fake_dist(tmp_path, monkeypatch):
    """A fake installed distribution, as a third-party package registering plugins or tasks would be:
    `make(entry_points={group: {name: value}}, modules={module_name: source}, dist_name=None)` writes a distribution
    (with a unique name unless `dist_name` is given) under a fresh folder and prepends that folder to `sys.path`.
    Everything is undone afterwards."""
    imported: list[str] = []

    def make(
        entry_points: dict[str, dict[str, str]], modules: dict[str, str] | None = None, dist_name: str | None = None
    ) -> str:
        root = tmp_path / uuid.uuid4().hex[:8]
        root.mkdir()
        for module, source in (modules or {}).items():
            (root / f"{module}.py").write_text(textwrap.dedent(source))
            imported.append(module)
        dist_name = dist_name or f"fake-trl-marl-plugin-{uuid.uuid4().hex[:8]}"
        info = root / f"{dist_name.replace('-', '_')}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1.0\n")
        lines = []
        for group, eps in entry_points.items():
            lines.append(f"[{group}]")
            lines += [f"{name} = {value}" for name, value in eps.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        monkeypatch.syspath_prepend(str(root))  # also invalidates the import caches
        return dist_name

    yield make
    for module in imported:
        sys.modules.pop(module, None)


def accelerate_launch(config_file, script, *args: str, timeout: int = 600, env: dict | None = None):
    """`accelerate launch --config_file CONFIG_FILE SCRIPT ARGS...` from the repository root, one thread per process,
    offline; `env` adds variables. Fails the test with the decisive lines (`launch_failure`) unless it exits 0."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file), str(script)]
    proc = subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout, cwd=root)
    assert proc.returncode == 0, launch_failure(proc)
    return proc


def launch_failure(proc, tail: int = 6000) -> str:
    """The assertion message for a failed subprocess (`accelerate launch`, a recipe): the lines that name the
    failure first (a rank's C++ `terminate`, a fatal signal with faulthandler's Python stacks, a traceback's last
    line), then the tails of stdout and stderr. A tool that shows only the head and tail of a long message still
    shows why a rank died."""
    err = proc.stderr if isinstance(proc.stderr, str) else (proc.stderr or b"").decode(errors="replace")
    out = proc.stdout if isinstance(proc.stdout, str) else (proc.stdout or b"").decode(errors="replace")
    keys = ("terminate called", "what():", "Fatal Python error", "Error:", "Exception:", "Signal ", "exitcode")
    lines = (out + "\n" + err).splitlines()
    decisive = []
    for i, line in enumerate(lines):
        if any(k in line for k in keys):
            decisive.extend(lines[max(0, i - 2) : i + 12] if "Fatal Python error" in line else [line])
    head = "\n".join(dict.fromkeys(decisive))[-6000:]
    return f"== decisive lines ==\n{head}\n== stdout tail ==\n{out[-3000:]}\n== stderr tail ==\n{err[-tail:]}"


# ------------------------------------------------------------------------------------- agentic teams (scripted)
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call><|im_end|>'
END = "<|im_end|>"


def tool_tokenizer(path):
    """The tiny tokenizer made ready for tool calls: the compact ChatML template, `<|im_end|>` ending a turn."""
    from transformers import AutoTokenizer

    from trl_marl.environments import use_compact_tool_template

    tok = AutoTokenizer.from_pretrained(path)
    use_compact_tool_template(tok)
    tok.eos_token = END
    return tok


def agentic_args(tmp_path, cls=None, **overrides):
    """A config for fast agentic CPU tests (MAGRPO's unless `cls`): `cpu_args` with sequential turns, room for a
    tool call and the config's default evaluation size."""
    from trl_marl import MAGRPOConfig

    settings = dict(max_completion_length=128, eval_num_samples=16, turn_order="sequential")
    return cpu_args(cls or MAGRPOConfig, tmp_path, **{**settings, **overrides})


class Scripted:
    """Replaces a trainer's generation: `policy(agent, prompt_text, continued) -> completion text` (continued: the
    prompt is a turn resumed after a tool result). Records every call as (agent, number of prompts)."""

    def __init__(self, trainer, policy):
        self.trainer, self.policy, self.calls = trainer, policy, []
        trainer.generation.generate = self

    def __call__(self, prompts_per_agent, num_generations, greedy=False):
        from trl_marl.data_types.rollout import GenerationOutput
        from trl_marl.generation.engine import prompt_token_ids

        outs = []
        for i, prompts in enumerate(prompts_per_agent):
            out = GenerationOutput([], [], [])
            if prompts:
                tok = self.trainer.tokenizers[i]
                self.calls.append((i, len(prompts)))
                for p, ids in zip(prompts, prompt_token_ids(tok, prompts, None)):
                    text = tok.decode(ids)
                    for _ in range(num_generations):
                        completion = self.policy(i, text, p.token_ids is not None)
                        cids = tok(completion, add_special_tokens=False)["input_ids"]
                        out.texts.append(tok.decode(cids, skip_special_tokens=True))
                        out.prompt_ids.append(torch.tensor(ids))
                        out.completion_ids.append(torch.tensor(cids))
            outs.append(out)
        return outs
