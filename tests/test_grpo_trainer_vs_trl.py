"""`MAGRPOTrainer` with TRL's loss family against `trl.GRPOTrainer` ITSELF, each through its own training loop.

One agent, the same prompts and the SAME completions injected into both trainers (TRL's `_generate` and our generation
engine return fixed token ids for each (prompt, sample, generation)), the same reward, SGD (so the weights after a
step are the gradient with factor 1, which Adam's normalisation would blur), a learning rate large enough that the
importance ratios leave 1 and the clipping acts on the second step. After `max_steps` optimizer steps on ONE
generation the two models' weights, and the metrics TRL logs, must agree.

One `GRPOTrainer` is built per module (its reference perturbed away from the policy); each case sets the attributes
`GRPOTrainer.__init__` derives from `GRPOConfig`, restores the initial weights and trains again. Two test-side
alignments, both documented where they are made: TRL shuffles a generation's rows across its micro-batches with the
global RNG (`shuffle_sequence_dict`; here the identity, so that both split the generation into the same consecutive
groups), and the prompts all have the same token length (TRL scores left-padded prompts without position ids, i.e. at
positions shifted by the padding, where `generate` and trl_marl use positions that follow the attention mask).
"""

from __future__ import annotations

import math

import pytest
import torch

from trl_marl import MAGRPOConfig, MAGRPOTrainer
from trl_marl.algorithms.grpo import LOSS_TYPES
from trl_marl.algorithms.grpo_advantages import SCALE_REWARDS
from trl_marl.algorithms.logprobs import token_logprobs
from trl_marl.data_types.rollout import GenerationOutput

G = 4
MAXLEN = 8
TEMPERATURE = 0.7
LR = 0.5
PAD, EOS = 0, 1
# four prompts of the same token length (checked in the fixture)
PROMPTS = ["the writer sun", "the writer moon", "the writer star", "the writer tree"]
TOL = dict(atol=2e-5, rtol=1e-4)


def _score(text: str) -> float:
    return float(sum(map(ord, text)) % 7) / 3 - 1.0


def _length(text: str) -> float:
    return float(len(text) % 5) - 2.0


def trl_reward(completions, **kwargs):
    return [_score(c) for c in completions]


def trl_length(completions, **kwargs):
    return [_length(c) for c in completions]


def our_reward(c1):
    return [_score(c) for c in c1]


def our_length(c1):
    return [_length(c) for c in c1]


class FixedCompletions:
    """The completion token ids of each (prompt, sample k, generation): lengths 2..MAXLEN, ending with EOS, the pad
    token, or cut at MAXLEN (truncated); the same for both trainers."""

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.calls = 0

    def ids(self, prompt: str, k: int, call: int) -> list[int]:
        seed = sum(map(ord, prompt)) * 31 + k * 7 + call * 101
        g = torch.Generator().manual_seed(seed)
        end = ["eos", "cut", "pad", "eos"][(seed // 3) % 4]
        n = MAXLEN if end == "cut" else int(torch.randint(2, MAXLEN + 1, (1,), generator=g))
        ids = torch.randint(4, self.vocab, (n,), generator=g).tolist()
        if end != "cut":
            ids[-1] = EOS if end == "eos" else PAD
        return ids


@pytest.fixture(scope="module")
def fixed(tiny_path):
    from transformers import AutoConfig

    return FixedCompletions(AutoConfig.from_pretrained(tiny_path).vocab_size)


@pytest.fixture(scope="module")
def tok(tiny_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    lengths = {len(tok(p)["input_ids"]) for p in PROMPTS}
    assert len(lengths) == 1, "the prompts must have the same token length (see the module docstring)"
    assert tok.pad_token_id == PAD and tok.eos_token_id == EOS
    return tok


def _sampling_logps(model, prompt_ids, completion_ids, call):
    """vLLM's log-probs stand-in: the training model's at the sampling temperature plus noise (one token unscored)."""
    g = torch.Generator().manual_seed(3 + call)
    out = []
    for p, c in zip(prompt_ids, completion_ids):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([list(p) + list(c)])).logits[:, len(p) - 1 : -1]
        lp = token_logprobs(logits, torch.tensor([list(c)]), TEMPERATURE)[0]
        out.append((lp + 0.1 * torch.randn(lp.shape, generator=g)).tolist())
    out[0][0] = None
    return out


@pytest.fixture(scope="module")
def trl_trainer(tiny_path, tok, fixed, tmp_path_factory):
    """A real `trl.GRPOTrainer` (beta > 0: it builds a reference, then moved away from the policy)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        num_generations=G,
        per_device_train_batch_size=len(PROMPTS) * G,
        max_completion_length=MAXLEN,
        temperature=TEMPERATURE,
        beta=0.04,
        optim="sgd",
        learning_rate=LR,
        lr_scheduler_type="constant",
        seed=0,
    )
    ds = Dataset.from_dict({"prompt": PROMPTS})
    trainer = GRPOTrainer(model=tiny_path, reward_funcs=[trl_reward, trl_length], args=args, train_dataset=ds)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.ref_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    trainer._test_ref = {k: v.clone() for k, v in trainer.ref_model.state_dict().items()}
    trainer._test_initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    def fake_generate(prompts):
        call = fixed.calls
        fixed.calls += 1
        prompt_ids = [tok(p)["input_ids"] for p in prompts]
        seen: dict = {}
        completion_ids = []
        for p in prompts:
            k = seen[p] = seen.get(p, -1) + 1
            completion_ids.append(fixed.ids(p, k, call))
        sampling = _sampling_logps(trainer.model, prompt_ids, completion_ids, call) if trainer.use_vllm else None
        texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
        return prompt_ids, completion_ids, None, texts, sampling, {}, None, []

    trainer._generate = fake_generate
    return trainer


# ---------------------------------------------------------------------------------------------------- one case
TRL_DEFAULTS = dict(
    loss_type="dapo",
    scale_rewards="group",
    beta=0.04,
    epsilon=0.2,
    epsilon_high=None,
    delta=None,
    importance_sampling_level="token",
    mask_truncated_completions=False,
    top_entropy_quantile=1.0,
    entropy_coef=0.0,
    off_policy_mask_threshold=None,
    num_iterations=2,
    steps_per_generation=1,
    multi_objective_aggregation="sum_then_normalize",
    vllm_importance_sampling_mode=None,  # a mode: use_vllm with the correction on
    vllm_importance_sampling_clip_min=None,
    vllm_importance_sampling_clip_max=3.0,
    gradient_accumulation_steps=1,
)


def _run_trl(trainer, case: dict) -> tuple[dict, list[dict]]:
    """Train TRL's trainer on one generation with `case`'s settings; returns (final weights, its logs)."""
    from trl.trainer import grpo_trainer

    a = trainer.args
    spg, iterations = case["steps_per_generation"], case["num_iterations"]
    trainer.loss_type = case["loss_type"]
    trainer.scale_rewards = case["scale_rewards"]
    trainer.beta = case["beta"]
    trainer.epsilon_low = case["epsilon"]
    trainer.epsilon_high = case["epsilon"] if case["epsilon_high"] is None else case["epsilon_high"]
    trainer.importance_sampling_level = case["importance_sampling_level"]
    trainer.mask_truncated_completions = case["mask_truncated_completions"]
    trainer.top_entropy_quantile = case["top_entropy_quantile"]
    trainer.entropy_coef = case["entropy_coef"]
    trainer._entropy_bonus_enabled = case["entropy_coef"] != 0.0
    trainer.off_policy_mask_threshold = case["off_policy_mask_threshold"]
    trainer.num_iterations = iterations
    trainer.multi_objective_aggregation = case["multi_objective_aggregation"]
    trainer.use_vllm = case["vllm_importance_sampling_mode"] is not None
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = case["vllm_importance_sampling_mode"] or "sequence_mask"
    trainer.vllm_importance_sampling_clip_min = case["vllm_importance_sampling_clip_min"]
    trainer.vllm_importance_sampling_clip_max = case["vllm_importance_sampling_clip_max"]
    a.delta = case["delta"]
    a.steps_per_generation = spg
    a.per_device_train_batch_size = trainer._train_batch_size = len(PROMPTS) * G // spg
    a.generation_batch_size = len(PROMPTS) * G
    a.gradient_accumulation_steps = case["gradient_accumulation_steps"]
    a.max_steps = spg * iterations // case["gradient_accumulation_steps"]
    trainer.model.load_state_dict(trainer._test_initial)
    trainer.ref_model.load_state_dict(trainer._test_ref)
    trainer.optimizer, trainer.lr_scheduler = None, None
    trainer._step, trainer._buffered_inputs = 0, None
    trainer._metrics["train"].clear()
    original = grpo_trainer.shuffle_sequence_dict
    grpo_trainer.shuffle_sequence_dict = lambda d: d  # see the module docstring
    try:
        trainer.train()
    finally:
        grpo_trainer.shuffle_sequence_dict = original
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, logs


def _our_trainer(tiny_path, tok, fixed, tmp_path, trl_trainer, case: dict, **config) -> MAGRPOTrainer:
    """Our trainer with the same settings, its engine returning the same completions (and, with a vLLM mode, the
    same sampled log-probs), its reference the same perturbed model."""
    vllm_mode = case["vllm_importance_sampling_mode"]
    args = MAGRPOConfig(
        output_dir=str(tmp_path / "ours"),
        num_agents=1,
        num_generations=G,
        rollout_buffer_size=len(PROMPTS),
        steps_per_generation=case["steps_per_generation"],
        num_iterations=case["num_iterations"],
        max_steps=case["steps_per_generation"] * case["num_iterations"] // case["gradient_accumulation_steps"],
        gradient_accumulation_steps=case["gradient_accumulation_steps"],
        max_completion_length=MAXLEN,
        temperature=TEMPERATURE,
        optim="sgd",
        learning_rate=LR,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        loss_type=case["loss_type"],
        scale_rewards=case["scale_rewards"],
        beta=case["beta"],
        epsilon=case["epsilon"],
        epsilon_high=case["epsilon_high"],
        delta=case["delta"],
        importance_sampling_level=case["importance_sampling_level"],
        mask_truncated_completions=case["mask_truncated_completions"],
        top_entropy_quantile=case["top_entropy_quantile"],
        entropy_coef=case["entropy_coef"],
        off_policy_mask_threshold=case["off_policy_mask_threshold"],
        multi_objective_aggregation=case["multi_objective_aggregation"],
        **config,
    )
    trainer = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=[our_reward, our_length],
        args=args,
        train_dataset=[{"prompt": p} for p in PROMPTS],
    )
    if trainer.reference_models is not None:
        trainer.reference_models[0].load_state_dict(trl_trainer._test_ref)
    if vllm_mode is not None:
        # a vLLM engine reports its sampled log-probs: here the fixed engine does, and the loss step is told so
        from trl_marl.trainers.grpo_step import GRPOLossStep

        # set after construction: with use_vllm=False (no vLLM here) the config refuses the vLLM settings
        trainer.args.use_vllm = True
        trainer.args.vllm_importance_sampling_mode = vllm_mode
        trainer.args.vllm_importance_sampling_clip_min = case["vllm_importance_sampling_clip_min"]
        trainer.args.vllm_importance_sampling_clip_max = case["vllm_importance_sampling_clip_max"]
        trainer.rl_step.grpo_step = GRPOLossStep(trainer)

    def generate(prompts_per_agent, num_generations, greedy=False):
        call = fixed.calls
        fixed.calls += 1
        prompts = [str(p) for p in prompts_per_agent[0]]
        prompt_ids = [torch.tensor(tok(p)["input_ids"]) for p in prompts for _ in range(num_generations)]
        comp = [torch.tensor(fixed.ids(p, k, call)) for p in prompts for k in range(num_generations)]
        texts = tok.batch_decode([c.tolist() for c in comp], skip_special_tokens=True)
        sampling = None
        if vllm_mode is not None:
            model = trainer.team.agents[0]
            sampling = [
                torch.tensor([math.nan if v is None else v for v in row])
                for row in _sampling_logps(model, [p.tolist() for p in prompt_ids], [c.tolist() for c in comp], call)
            ]
        return [GenerationOutput(texts, prompt_ids, comp, sampling)]

    trainer.generation.generate = generate
    return trainer


def run_case(trl_trainer, tiny_path, tok, fixed, tmp_path, **overrides) -> tuple[list[dict], list[dict]]:
    """Both trainers on one generation; asserts equal final weights and equal logged metrics; returns both logs."""
    case = {**TRL_DEFAULTS, **overrides}
    fixed.calls = 0
    trl_weights, trl_logs = _run_trl(trl_trainer, case)
    trl_calls = fixed.calls
    fixed.calls = 0
    ours = _our_trainer(tiny_path, tok, fixed, tmp_path, trl_trainer, case)
    ours.train()
    assert fixed.calls == trl_calls == 1, "one generation, reused by every step"
    our_weights = ours.team.agents[0].state_dict()
    initial = trl_trainer._test_initial
    moved = max(float((trl_weights[k] - initial[k]).abs().max()) for k in initial)
    assert moved > 1e-3
    for k, v in trl_weights.items():
        torch.testing.assert_close(our_weights[k], v, **TOL, msg=lambda m, k=k: f"{k}: {m}")
    our_logs = [h for h in ours.state.log_history if "loss" in h]
    steps = case["steps_per_generation"] * case["num_iterations"] // case["gradient_accumulation_steps"]
    assert len(our_logs) == len(trl_logs) == steps
    for step, (mine, theirs) in enumerate(zip(our_logs, trl_logs)):
        for key, value in theirs.items():
            if (
                key.startswith(("clip_ratio/", "kl", "entropy", "cispo", "vespo", "sampling/"))
                and key != "entropy_coef"
            ):
                assert key in mine, f"step {step}: we do not log TRL's {key!r}"
                if not (math.isnan(value) and math.isnan(mine[key])):
                    assert math.isclose(mine[key], value, rel_tol=1e-4, abs_tol=1e-5), (step, key, mine[key], value)
                assert f"agent_1/{key}" in mine
    return our_logs, trl_logs


# ---------------------------------------------------------------------------------------------------- the grid
@pytest.mark.parametrize("scale_rewards", SCALE_REWARDS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_and_reward_scaling_trains_as_grpo_trainer(
    trl_trainer, tiny_path, tok, fixed, tmp_path, loss_type, scale_rewards
):
    """beta > 0 with a reference that differs from the policy, num_iterations=2 on one generation (the second step
    is off-policy: ratios away from 1, clipping acting); luspo at the sequence level (its paper's setup)."""
    level = "sequence" if loss_type == "luspo" else "token"
    eps_high = 5.0 if loss_type == "cispo" else 0.28
    ours, _ = run_case(
        trl_trainer,
        tiny_path,
        tok,
        fixed,
        tmp_path,
        loss_type=loss_type,
        scale_rewards=scale_rewards,
        importance_sampling_level=level,
        epsilon_high=eps_high,
    )
    assert ours[-1]["kl"] > 0
    if loss_type in ("grpo", "dapo", "dr_grpo", "bnpo"):
        assert ours[0]["clip_ratio/region_mean"] == 0  # the first step is on the generating weights
        assert ours[-1]["clip_ratio/region_mean"] > 0  # the second is not: the clipping acts


@pytest.mark.parametrize(
    "overrides",
    [
        # GSPO: one ratio per completion; two steps per generation, each taken twice
        dict(loss_type="grpo", importance_sampling_level="sequence", steps_per_generation=2, epsilon=3e-4),
        # truncated completions left out of the loss (and of dapo's token count)
        dict(mask_truncated_completions=True),
        # four steps on one generation (each step one group): dapo's N spans the generation batch
        dict(num_iterations=1, steps_per_generation=4),
        # gradient accumulation over two of four steps per generation (old log-probs kept: GA % 4 != 0)
        dict(num_iterations=1, steps_per_generation=4, gradient_accumulation_steps=2, loss_type="bnpo"),
        dict(loss_type="grpo", delta=1.5, off_policy_mask_threshold=0.0, scale_rewards="batch"),
        dict(top_entropy_quantile=0.5, entropy_coef=0.01, loss_type="dr_grpo"),
        dict(beta=0.0, loss_type="cispo", epsilon_high=5.0),
        dict(multi_objective_aggregation="normalize_then_sum", loss_type="grpo"),
        # vLLM's importance-sampling correction (the engine reports its sampled log-probs)
        dict(vllm_importance_sampling_mode="sequence_mask"),
        dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=1.1, loss_type="grpo"),
        dict(
            vllm_importance_sampling_mode="token_mask",
            vllm_importance_sampling_clip_min=0.9,
            vllm_importance_sampling_clip_max=None,
            loss_type="vespo",
        ),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_settings_train_as_grpo_trainer(trl_trainer, tiny_path, tok, fixed, tmp_path, overrides):
    ours, _ = run_case(trl_trainer, tiny_path, tok, fixed, tmp_path, **overrides)
    if overrides.get("vllm_importance_sampling_mode"):
        assert ours[0]["sampling/importance_sampling_ratio/min"] != ours[0]["sampling/importance_sampling_ratio/max"]
    if overrides.get("beta") == 0.0:
        assert "kl" not in ours[0]
