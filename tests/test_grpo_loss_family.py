"""`trl_marl.algorithms.grpo` against `trl.GRPOTrainer` ITSELF (TRL 1.16), with factor 1.

One real `GRPOTrainer` (tiny local model, a perturbed reference) is built per module. For each case its
config-derived attributes are set, TRL's own `_generate_and_score_completions` builds the `inputs` dict (with
`_generate` replaced by fixed completions: that is where the advantages, the truncation mask, the reference and old
log-probs and the vLLM importance-sampling ratio come from), the policy is moved away from the generation weights
(as after an optimizer step of `num_iterations=2`), and TRL's `_compute_loss` is compared with `grpo_loss` computed
from the same model's logits (`token_logprobs` / `token_entropies` at the sampling temperature): loss, gradient of
every parameter, and TRL's logged metrics.
"""

from __future__ import annotations

import math

import pytest
import torch

from trl_marl.algorithms import group_advantages, policy_gradient_loss, sequence_logprobs
from trl_marl.algorithms.grpo import (
    LOSS_TYPES,
    BatchTotals,
    GRPOLossSettings,
    adaptive_entropy_coef,
    dapo_normalizer,
    entropy_bonus,
    grpo_loss,
    high_entropy_mask,
    k3_kl_per_token,
    mask_truncated_completions,
    seed_loss_mapping,
    truncated_completions,
    vllm_importance_sampling_metrics,
    vllm_importance_sampling_ratio,
)
from trl_marl.algorithms.grpo_advantages import (
    SCALE_REWARDS,
    frac_reward_zero_std,
    group_reward_stats,
    multi_objective_advantages,
    scale_advantages,
)
from trl_marl.algorithms.logprobs import token_entropies, token_logprobs

G = 4  # num_generations
MAXLEN = 10  # max_completion_length: longer than every completion, so dr_grpo's constant is not the padded width
TEMPERATURE = 0.7
PAD, EOS = 0, 1  # the tiny tokenizer's <|pad|> and <|endoftext|>
# (prompt, r1, r2) per row, G rows per prompt. None = the reward function returned None (NaN in TRL).
ROWS = [
    ("the writer and the editor", 1.0, 0.5),
    ("the writer and the editor", 0.0, 0.25),
    ("the writer and the editor", 2.0, None),
    ("the writer and the editor", -1.0, 1.0),
    ("a short story", 0.5, 0.0),  # r1 all equal in this group: its group std is 0
    ("a short story", 0.5, 1.0),
    ("a short story", 0.5, None),
    ("a short story", 0.5, 0.5),
    ("count the red stars in the night sky", 3.0, -0.5),
    ("count the red stars in the night sky", None, None),  # unscorable: advantage 0
    ("count the red stars in the night sky", -2.0, 0.75),
    ("count the red stars in the night sky", 1.5, 2.0),
]
# completions: lengths 2..8, ending with EOS, with the pad token (not truncated for TRL either) or cut (truncated:
# TRL only looks at the last token)
LENGTHS = [3, 8, 5, 2, 8, 4, 6, 8, 7, 3, 8, 5]
ENDINGS = ["eos", "cut", "eos", "eos", "eos", "pad", "cut", "cut", "eos", "eos", "cut", "pad"]
REWARD_WEIGHTS = [1.0, 0.5]
TOL = dict(atol=2e-6, rtol=1e-5)
# largest |ours - TRL| and largest |TRL| per quantity, printed at the end of the module (pytest -s)
MEASURED: dict[str, tuple[float, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def report_measured_differences():
    yield
    for name, (diff, scale) in sorted(MEASURED.items()):
        print(f"max |ours - TRL| {name}: {diff:.2e} (max |TRL| {scale:.2e})")


def r1(completions, **kw):
    return kw["r1"]


def r2(completions, **kw):
    return kw["r2"]


def _completions(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    out = []
    for n, end in zip(LENGTHS, ENDINGS):
        ids = torch.randint(4, vocab, (n,), generator=g).tolist()
        if end != "cut":
            ids[-1] = EOS if end == "eos" else PAD
        out.append(ids)
    return out


@pytest.fixture(scope="module")
def grpo(tiny_path, tmp_path_factory):
    """A real `trl.GRPOTrainer` on the tiny model, with a reference that differs from the policy."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        num_generations=G,
        per_device_train_batch_size=len(ROWS),
        max_completion_length=MAXLEN,
        temperature=TEMPERATURE,
        beta=0.04,  # builds the reference model
        disable_dropout=True,
        logging_steps=1,
        seed=0,
    )
    ds = Dataset.from_dict({"prompt": [r[0] for r in ROWS], "r1": [r[1] for r in ROWS], "r2": [r[2] for r in ROWS]})
    trainer = GRPOTrainer(model=tiny_path, reward_funcs=[r1, r2], args=args, train_dataset=ds)
    assert trainer.eos_token_ids == [EOS] and trainer._tokenizer.pad_token_id == PAD
    assert trainer.accelerator.num_processes == 1
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in trainer.ref_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    trainer.model.train()
    trainer._test_initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer._test_completions = _completions(trainer.model.config.vocab_size)
    return trainer


# ---------------------------------------------------------------------------------------------------- case setup
DEFAULTS = dict(
    loss_type="dapo",
    beta=0.04,
    epsilon=0.2,
    epsilon_high=None,
    delta=None,
    importance_sampling_level="token",
    sapo_temperature_pos=1.0,
    sapo_temperature_neg=1.05,
    vespo_k_pos=2.0,
    vespo_lambda_pos=3.0,
    vespo_k_neg=3.0,
    vespo_lambda_neg=2.0,
    use_bias_correction_kl=True,
    off_policy_mask_threshold=None,
    top_entropy_quantile=1.0,
    entropy_coef=0.0,
    # not loss settings: how the inputs are built
    scale_rewards="group",
    multi_objective_aggregation="sum_then_normalize",
    mask_truncated_completions=False,
    vllm_mode=None,  # a vllm_importance_sampling_mode: use_vllm + correction on
    vllm_clip_min=None,
    vllm_clip_max=3.0,
    old_logps=True,  # False: num_iterations=1 and steps_per_generation == GA (TRL passes no old log-probs)
    grad_accum=1,
    steps_per_generation=1,
    policy_noise=0.03,  # how far the policy moves after generation (ratios away from 1)
)
_SETTING_FIELDS = [f for f in GRPOLossSettings.__dataclass_fields__ if f != "max_completion_length"]


def _configure(trainer, case: dict) -> None:
    """Set TRL's config-derived attributes (what `GRPOTrainer.__init__` reads from `GRPOConfig`)."""
    a = trainer.args
    trainer.loss_type = case["loss_type"]
    trainer.beta = case["beta"]
    trainer.epsilon_low = case["epsilon"]
    trainer.epsilon_high = case["epsilon_high"] if case["epsilon_high"] is not None else case["epsilon"]
    trainer.importance_sampling_level = case["importance_sampling_level"]
    trainer.off_policy_mask_threshold = case["off_policy_mask_threshold"]
    trainer.top_entropy_quantile = case["top_entropy_quantile"]
    trainer.entropy_coef = case["entropy_coef"]
    trainer.use_adaptive_entropy = False
    trainer._entropy_bonus_enabled = case["entropy_coef"] != 0.0
    trainer.scale_rewards = case["scale_rewards"]
    trainer.multi_objective_aggregation = case["multi_objective_aggregation"]
    trainer.reward_weights = torch.tensor(REWARD_WEIGHTS)
    trainer.mask_truncated_completions = case["mask_truncated_completions"]
    trainer.use_vllm = case["vllm_mode"] is not None
    trainer.vllm_importance_sampling_correction = True
    trainer.vllm_importance_sampling_mode = case["vllm_mode"] or "sequence_mask"
    trainer.vllm_importance_sampling_clip_min = case["vllm_clip_min"]
    trainer.vllm_importance_sampling_clip_max = case["vllm_clip_max"]
    trainer.current_gradient_accumulation_steps = case["grad_accum"]
    for name in ("delta", "sapo_temperature_pos", "sapo_temperature_neg", "use_bias_correction_kl"):
        setattr(a, name, case[name])
    for name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
        setattr(a, name, case[name])
    a.steps_per_generation = case["steps_per_generation"]
    # TRL recomputes the old log-probs when GA is not a multiple of steps_per_generation * num_iterations
    a.gradient_accumulation_steps = 1
    trainer.num_iterations = 2 if case["old_logps"] else 1
    trainer._metrics["train"].clear()


def _our_logps(model, inputs, requires_grad: bool = True):
    """Per-token log-probs and entropies of the completion tokens from the plain forward (logits), at the sampling
    temperature: trl_marl's path, not TRL's fused head."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    C = inputs["completion_ids"].shape[1]
    with torch.set_grad_enabled(requires_grad):
        logits = model(input_ids=ids, attention_mask=attn).logits[:, -C - 1 : -1]
        logps = token_logprobs(logits, inputs["completion_ids"], TEMPERATURE)
        entropies = token_entropies(logits, TEMPERATURE)  # carries the gradient of the entropy bonus
    return logps, entropies


def _build_inputs(trainer, case: dict) -> tuple[dict, dict]:
    """TRL's own `_generate_and_score_completions` on fixed completions; returns (inputs, what _generate saw)."""
    tok = trainer.processing_class
    completions = trainer._test_completions
    seen: dict = {}

    def fake_generate(prompts):
        prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        sampling = None
        if trainer.use_vllm:  # vLLM's log-probs: the training model's, plus noise (and one token vLLM could not score)
            g = torch.Generator().manual_seed(3)
            sampling = []
            for p_ids, c_ids in zip(prompt_ids, completions):
                ids = torch.tensor([p_ids + c_ids])
                with torch.no_grad():
                    logits = trainer.model(input_ids=ids).logits[:, len(p_ids) - 1 : -1]
                lp = token_logprobs(logits, torch.tensor([c_ids]), TEMPERATURE)[0]
                sampling.append((lp + 0.25 * torch.randn(lp.shape, generator=g)).tolist())
            sampling[2][1] = None
        seen["sampling"] = sampling
        texts = tok.batch_decode(completions, skip_special_tokens=True)
        return prompt_ids, [list(c) for c in completions], None, texts, sampling, {}, None, []

    trainer._generate = fake_generate
    rows = [{"prompt": p, "r1": a, "r2": b} for p, a, b in ROWS]
    inputs = trainer._generate_and_score_completions(rows)
    return inputs, seen


def _move_policy(trainer, scale: float) -> None:
    """The policy after generation moves (as after an optimizer step), so the importance ratios leave 1."""
    trainer.model.load_state_dict(trainer._test_initial)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def _grads(model) -> torch.Tensor:
    out = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return out


def _record(name: str, a: torch.Tensor, b: torch.Tensor) -> float:
    diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    scale = float(b.double().abs().max()) if b.numel() else 0.0
    old = MEASURED.get(name, (0.0, 0.0))
    MEASURED[name] = (max(old[0], diff), max(old[1], scale))
    return diff


def _settings(case: dict) -> GRPOLossSettings:
    return GRPOLossSettings(**{k: case[k] for k in _SETTING_FIELDS}, max_completion_length=MAXLEN)


def run_case(trainer, **overrides) -> dict:
    """Compare `grpo_loss` with TRL's `_compute_loss` on one case; returns TRL's logged metrics."""
    case = {**DEFAULTS, **overrides}
    _configure(trainer, case)
    trainer.model.load_state_dict(trainer._test_initial)
    inputs, _ = _build_inputs(trainer, case)
    if not case["old_logps"] and case["vllm_mode"] is None:
        inputs.pop("old_per_token_logps", None)
        _move_policy(trainer, 0.0)
    else:
        assert "old_per_token_logps" in inputs
        _move_policy(trainer, case["policy_noise"])
    if case["grad_accum"] > 1 or case["steps_per_generation"] > 1:  # this micro-batch is one of several
        inputs["num_items_in_batch"] = inputs["num_items_in_batch"] * case["steps_per_generation"] + 5
    model = trainer.model
    trainer._metrics["train"].clear()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = _grads(model)
    trl_metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}

    logps, entropies = _our_logps(model, inputs)
    settings = _settings(case)
    normalizer = dapo_normalizer(inputs["num_items_in_batch"], 1, case["grad_accum"], case["steps_per_generation"])
    loss, metrics = grpo_loss(
        logps,
        inputs["advantages"],
        inputs["completion_mask"],
        settings,
        old_logps=inputs.get("old_per_token_logps"),
        ref_logps=inputs.get("ref_per_token_logps"),
        entropies=entropies,
        importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
        sampling_logps=inputs.get("sampling_per_token_logps"),
        token_normalizer=normalizer,
        gradient_accumulation_steps=case["grad_accum"],
    )
    loss.backward()
    grads = _grads(model)
    tag = f"{case['loss_type']}"
    assert _record(f"loss/{tag}", loss.detach(), trl_loss.detach()) <= 2e-6, (loss.item(), trl_loss.item())
    assert grads.abs().max() > 0
    _record(f"grad/{tag}", grads, trl_grads)
    torch.testing.assert_close(grads, trl_grads, **TOL)
    for key, value in metrics.items():
        assert key in trl_metrics, f"TRL logs no {key!r}"
        _record("metrics", value, torch.tensor(trl_metrics[key]))
        assert math.isclose(float(value), trl_metrics[key], rel_tol=1e-5, abs_tol=1e-6), key
    for key in trl_metrics:
        if key.startswith(("clip_ratio", "kl", "entropy", "cispo", "vespo", "policy_loss")) and key != "entropy_coef":
            assert key in metrics, f"we do not compute TRL's {key!r}"
    return trl_metrics


# ---------------------------------------------------------------------------------------------------- the grid
@pytest.mark.parametrize("scale_rewards", SCALE_REWARDS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_and_reward_scaling_matches_trl(grpo, loss_type, scale_rewards):
    """beta > 0 with a reference that differs from the policy, old log-probs from before the policy moved (ratios
    away from 1, clipping active); luspo at the sequence level (its paper's setup), the others per token."""
    level = "sequence" if loss_type == "luspo" else "token"
    eps_high = 5.0 if loss_type == "cispo" else 0.28  # cispo: eps_max (ScaleRL's value)
    m = run_case(
        grpo,
        loss_type=loss_type,
        scale_rewards=scale_rewards,
        importance_sampling_level=level,
        epsilon_high=eps_high,
    )
    assert m["kl"] > 0
    if loss_type in ("grpo", "dapo", "dr_grpo", "bnpo"):  # the clipping is really exercised, both sides
        assert m["clip_ratio/low_mean"] > 0 and m["clip_ratio/high_mean"] > 0 and m["clip_ratio/region_mean"] < 0.9


@pytest.mark.parametrize(
    "overrides",
    [
        dict(loss_type="grpo", importance_sampling_level="sequence"),  # GSPO
        dict(loss_type="dapo", importance_sampling_level="sequence"),
        dict(loss_type="sapo", importance_sampling_level="sequence"),
        dict(loss_type="luspo", importance_sampling_level="token"),
        dict(loss_type="grpo", delta=1.25, epsilon_high=0.28),  # two-sided clipping (INTELLECT-2)
        dict(loss_type="dapo", delta=1.1, epsilon=0.1),
        dict(loss_type="dapo", beta=0.0),
        dict(loss_type="grpo", beta=0.1, use_bias_correction_kl=False),
        dict(loss_type="dr_grpo", old_logps=False),  # num_iterations=1: TRL passes no old log-probs
        dict(loss_type="grpo", old_logps=False, beta=0.0),
        dict(loss_type="sapo", sapo_temperature_pos=0.5, sapo_temperature_neg=2.0),
        dict(loss_type="vespo", vespo_k_pos=1.5, vespo_lambda_pos=1.0, vespo_k_neg=2.5, vespo_lambda_neg=0.5),
        dict(loss_type="cispo", epsilon_high=1.05),
        dict(loss_type="dapo", mask_truncated_completions=True),
        dict(loss_type="grpo", mask_truncated_completions=True, importance_sampling_level="sequence"),
        dict(loss_type="dapo", top_entropy_quantile=0.3),
        dict(loss_type="grpo", top_entropy_quantile=0.0, mask_truncated_completions=True),
        dict(loss_type="dapo", entropy_coef=0.05),
        dict(loss_type="grpo", entropy_coef=0.05, top_entropy_quantile=0.5),
        dict(loss_type="dapo", grad_accum=2, steps_per_generation=2),  # one micro-batch of an accumulation window
        dict(loss_type="bnpo", grad_accum=2, steps_per_generation=2),
        dict(loss_type="vespo", grad_accum=4, steps_per_generation=2, entropy_coef=0.01),
        dict(loss_type="dapo", off_policy_mask_threshold=0.01),
        dict(loss_type="grpo", multi_objective_aggregation="normalize_then_sum"),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_grpo_options_match_trl(grpo, overrides):
    m = run_case(grpo, **overrides)
    if overrides.get("loss_type") == "cispo":
        assert m["cispo_clip_ratio"] > 0  # the cap is active
    if overrides.get("loss_type") == "vespo":
        assert abs(m["vespo/phi_seq_mean"] - 1) > 1e-3  # the Gamma weights are away from phi(1) = 1


@pytest.mark.parametrize(
    "overrides",
    [
        dict(vllm_mode="sequence_mask"),  # TRL's default mode, clip_max 3
        dict(vllm_mode="sequence_mask", vllm_clip_min=0.5, vllm_clip_max=1.5),
        dict(vllm_mode="sequence_truncate", vllm_clip_min=0.5, vllm_clip_max=1.5),
        dict(vllm_mode="token_truncate", vllm_clip_max=1.1),
        dict(vllm_mode="token_mask", vllm_clip_min=0.9, vllm_clip_max=None),
        dict(vllm_mode="token_mask", vllm_clip_max=1.2, loss_type="vespo"),
        dict(
            vllm_mode="token_truncate",
            vllm_clip_min=0.8,
            vllm_clip_max=1.3,
            loss_type="grpo",
            off_policy_mask_threshold=0.0,
        ),
        dict(
            vllm_mode="sequence_truncate", vllm_clip_max=1.2, loss_type="dr_grpo", importance_sampling_level="sequence"
        ),
    ],
    ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()),
)
def test_vllm_importance_sampling_correction_matches_trl(grpo, overrides):
    """The IS ratio of TRL's generation path equals `vllm_importance_sampling_ratio` (NaN sampling log-prob
    included), its sampling metrics equal ours, and the corrected loss and gradient match."""
    case = {**DEFAULTS, **overrides}
    _configure(grpo, case)
    grpo.model.load_state_dict(grpo._test_initial)
    inputs, seen = _build_inputs(grpo, case)
    trl_metrics = {k: v[-1] for k, v in grpo._metrics["train"].items()}
    mask = inputs["completion_mask"]
    sampling = inputs["sampling_per_token_logps"]
    assert torch.isnan(sampling).any()
    ratio = vllm_importance_sampling_ratio(
        inputs["old_per_token_logps"], sampling, mask, case["vllm_mode"], case["vllm_clip_min"], case["vllm_clip_max"]
    )
    _record("vllm/ratio", ratio, inputs["importance_sampling_ratio"])
    torch.testing.assert_close(ratio, inputs["importance_sampling_ratio"], atol=0, rtol=0)
    r = ratio if ratio.shape[1] == 1 else ratio[mask.bool()]
    assert (r != 1).any()
    if case["vllm_mode"].endswith("_mask") and (case["vllm_clip_min"] is not None or case["vllm_clip_max"] < 3):
        assert (r == 0).any()  # the bounds are really exercised
    for key, value in vllm_importance_sampling_metrics(inputs["old_per_token_logps"], sampling, mask, ratio).items():
        assert math.isclose(float(value), trl_metrics[key], rel_tol=1e-6, abs_tol=1e-7), key
    run_case(grpo, **overrides)


# ---------------------------------------------------------------------------------------------------- advantages
@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("scale_rewards", SCALE_REWARDS)
def test_advantages_match_trls_generation_path(grpo, scale_rewards, aggregation):
    """`multi_objective_advantages` equals the advantages TRL's `_generate_and_score_completions` computes (two
    reward functions with weights, None rewards, an all-equal group, an unscorable completion)."""
    case = {**DEFAULTS, "scale_rewards": scale_rewards, "multi_objective_aggregation": aggregation}
    _configure(grpo, case)
    grpo.model.load_state_dict(grpo._test_initial)
    inputs, _ = _build_inputs(grpo, case)
    table = torch.tensor([[math.nan if x is None else x for x in r[1:]] for r in ROWS])
    ours = multi_objective_advantages(table, G, REWARD_WEIGHTS, scale_rewards, aggregation)
    _record("advantages", ours, inputs["advantages"])
    torch.testing.assert_close(ours, inputs["advantages"], atol=1e-6, rtol=1e-6)
    assert ours[9] == 0  # unscorable
    # the same groups given as (shuffled) ids
    perm = torch.randperm(len(ROWS), generator=torch.Generator().manual_seed(0))
    ids = (torch.arange(len(ROWS)) // G)[perm]
    shuffled = multi_objective_advantages(table[perm], ids, REWARD_WEIGHTS, scale_rewards, aggregation)
    torch.testing.assert_close(shuffled, ours[perm], atol=1e-6, rtol=1e-6)
    trl_metrics = {k: v[-1] for k, v in grpo._metrics["train"].items()}
    if aggregation == "sum_then_normalize":
        summed = (torch.nan_to_num(table) * torch.tensor(REWARD_WEIGHTS)).sum(1)
        summed[9] = math.nan
        frac = frac_reward_zero_std(summed, G, scale_rewards)
        assert math.isclose(float(frac), trl_metrics["frac_reward_zero_std"], abs_tol=1e-7)


def test_scale_advantages_by_hand():
    """TRL's formula (`grpo_trainer.py` ~2772-2800): group mean baseline, Bessel nanstd + 1e-4; batch scaling keeps
    the GROUP mean and divides by the batch std."""
    r = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0, 0.0, 4.0])
    g0, g1 = r[:4], r[4:]
    s0, s1 = g0.std(unbiased=True), g1.std(unbiased=True)
    expected_group = torch.cat([(g0 - g0.mean()) / (s0 + 1e-4), (g1 - g1.mean()) / (s1 + 1e-4)])
    torch.testing.assert_close(scale_advantages(r, 4, "group"), expected_group)
    expected_batch = torch.cat([g0 - g0.mean(), g1 - g1.mean()]) / (r.std(unbiased=True) + 1e-4)
    torch.testing.assert_close(scale_advantages(r, 4, "batch"), expected_batch)
    torch.testing.assert_close(scale_advantages(r, 4, "none"), torch.cat([g0 - g0.mean(), g1 - g1.mean()]))
    # a group of one has std 0 (TRL's num_generations == 1 branch) and advantage 0
    assert torch.equal(scale_advantages(torch.tensor([3.0, 5.0]), 1, "group"), torch.zeros(2))
    mean, std = group_reward_stats(torch.tensor([1.0, math.nan, 3.0, 5.0]), 2)
    torch.testing.assert_close(mean, torch.tensor([1.0, 1.0, 4.0, 4.0]))
    assert torch.isnan(std[:2]).all() and math.isclose(float(std[2]), math.sqrt(2), rel_tol=1e-6)


# ---------------------------------------------------------------------------------------------------- masks
def test_truncation_mask_matches_trl(grpo):
    case = {**DEFAULTS, "mask_truncated_completions": True}
    _configure(grpo, case)
    grpo.model.load_state_dict(grpo._test_initial)
    inputs, _ = _build_inputs(grpo, case)
    ids = inputs["completion_ids"]
    full = torch.zeros_like(ids)
    for b, n in enumerate(LENGTHS):
        full[b, :n] = 1
    truncated = truncated_completions(ids, full, grpo.eos_token_ids, grpo._tokenizer.pad_token_id)
    assert truncated.tolist() == [e == "cut" for e in ENDINGS]
    assert torch.equal(mask_truncated_completions(full, truncated), inputs["completion_mask"])


def test_high_entropy_mask_matches_trl(grpo):
    g = torch.Generator().manual_seed(5)
    entropies = torch.rand(6, 9, generator=g) * 3
    mask = (torch.rand(6, 9, generator=g) > 0.3).long()
    for q in (0.0, 0.2, 0.5, 0.9, 1.0):
        ours = high_entropy_mask(entropies, mask, q)
        assert torch.equal(ours, grpo.get_high_entropy_mask(entropies, mask, 1 - q)), q
    assert high_entropy_mask(entropies, mask, 0.0).sum() == 1  # only the highest-entropy token


def test_k3_matches_the_seed_estimator():
    from trl_marl.algorithms import k3_kl

    g = torch.Generator().manual_seed(2)
    lp, ref = -torch.rand(3, 5, generator=g) * 4, -torch.rand(3, 5, generator=g) * 4
    torch.testing.assert_close(k3_kl_per_token(lp, ref).sum(-1), k3_kl(lp, ref))


def test_adaptive_entropy_control_matches_trl(grpo):
    """TRL updates the coefficient from the window's entropy and applies the coefficient of the previous step."""
    case = {**DEFAULTS, "loss_type": "dapo", "beta": 0.0}
    _configure(grpo, case)
    grpo.model.load_state_dict(grpo._test_initial)
    inputs, _ = _build_inputs(grpo, case)
    _move_policy(grpo, 0.03)
    a = grpo.args
    a.entropy_target, a.entropy_coef_delta, a.entropy_coef_min, a.entropy_coef_max = 100.0, 0.01, 0.0, 0.5
    grpo.use_adaptive_entropy, grpo._entropy_bonus_enabled = True, True
    grpo.entropy_coef, grpo._last_world_entropy, grpo._entropy_window_stats = 0.02, 50.0, None
    trl_loss = grpo._compute_loss(grpo.model, inputs)
    logps, entropies = _our_logps(grpo.model, inputs, requires_grad=False)
    settings = GRPOLossSettings(loss_type="dapo", entropy_coef=0.02)  # last entropy 50 <= target: applied
    loss, _ = grpo_loss(
        logps,
        inputs["advantages"],
        inputs["completion_mask"],
        settings,
        inputs["old_per_token_logps"],
        entropies=entropies,
    )
    assert math.isclose(loss.item(), trl_loss.item(), rel_tol=1e-5, abs_tol=2e-6)
    m = inputs["completion_mask"].float()
    world = float((entropies * m).sum() / m.sum())
    nxt, apply_next = adaptive_entropy_coef(0.02, world, 100.0, 0.01, 0.0, 0.5)
    assert math.isclose(grpo.entropy_coef, nxt) and nxt == pytest.approx(0.03) and apply_next == nxt
    assert adaptive_entropy_coef(0.02, 150.0, 100.0, 0.01, 0.0, 0.5) == (pytest.approx(0.01), 0.0)
    grpo.use_adaptive_entropy = False


# ---------------------------------------------------------------------------------------------------- the seed
@pytest.mark.parametrize("normalize", [False, True])
def test_seed_loss_is_dr_grpo_times_max_completion_length(normalize):
    """The seed's gradient (`policy_gradient_loss` on sequence log-probs) equals `max_completion_length` times TRL's
    `dr_grpo` gradient (beta 0, one iteration) with the same advantages; its advantages equal TRL's
    `scale_rewards="none"` without normalization, and `"group"` times sqrt(G/(G-1)) + 1e-4/std_pop with it."""
    g = torch.Generator().manual_seed(4)
    B, T = 8, MAXLEN
    logps = (-torch.rand(B, T, generator=g) * 5).requires_grad_()
    mask = (torch.arange(T) < torch.randint(1, T + 1, (B, 1), generator=g)).long()
    rewards = torch.randn(B, generator=g)
    mapping = seed_loss_mapping(normalize, MAXLEN)
    seed_adv = group_advantages(rewards.view(-1, G), "mean", normalize=normalize).flatten()
    trl_adv = scale_advantages(rewards, G, mapping.scale_rewards)
    if normalize:
        pop = rewards.view(-1, G).std(dim=1, unbiased=False).repeat_interleave(G)
        factor = math.sqrt(G / (G - 1)) + 1e-4 / pop
        torch.testing.assert_close(seed_adv, trl_adv * factor)
        assert not mapping.exact_advantages
    else:
        torch.testing.assert_close(seed_adv, trl_adv)
        assert mapping.exact_advantages
    policy_gradient_loss(sequence_logprobs(logps, mask), seed_adv).backward()
    seed_grad, logps.grad = logps.grad.clone(), None
    grpo_loss(logps, seed_adv, mask, mapping.settings)[0].backward()
    torch.testing.assert_close(seed_grad, mapping.gradient_factor * logps.grad)
    # and dapo's factor is not a constant: it is the batch's token count / B
    logps.grad = None
    grpo_loss(logps, seed_adv, mask, GRPOLossSettings(loss_type="dapo"))[0].backward()
    torch.testing.assert_close(seed_grad, float(mask.sum()) / B * logps.grad)


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(loss_type="ppo"), "loss_type"),
        (dict(importance_sampling_level="tokens"), "importance_sampling_level"),
        (dict(epsilon=-0.1), "epsilon"),
        (dict(epsilon_high=-1.0), "epsilon_high"),
        (dict(beta=-0.01), "beta"),
        (dict(delta=0.0), "delta"),
        (dict(sapo_temperature_neg=0.0), "sapo_temperature_neg"),
        (dict(vespo_lambda_pos=-1.0), "vespo_lambda_pos"),
        (dict(top_entropy_quantile=1.5), "top_entropy_quantile"),
        (dict(off_policy_mask_threshold=-0.5), "off_policy_mask_threshold"),
        (dict(loss_type="dr_grpo"), "max_completion_length"),
        (dict(max_completion_length=0), "max_completion_length"),
    ],
)
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GRPOLossSettings(**kwargs)


def test_bad_input_names_the_field_and_allowed_values():
    r = torch.zeros(4)
    with pytest.raises(ValueError, match=r"scale_rewards must be one of \['group', 'batch', 'none'\]"):
        scale_advantages(r, 2, "std")
    with pytest.raises(ValueError, match="multi_objective_aggregation must be one of"):
        multi_objective_advantages(r.view(4, 1), 2, multi_objective_aggregation="sum")
    with pytest.raises(ValueError, match="reward_weights"):
        multi_objective_advantages(r.view(4, 1), 2, reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="divide"):
        scale_advantages(r, 3)
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode must be one of"):
        vllm_importance_sampling_ratio(r.view(2, 2), r.view(2, 2), r.view(2, 2), "seq")
    with pytest.raises(ValueError, match="must be less than"):
        vllm_importance_sampling_ratio(r.view(2, 2), r.view(2, 2), r.view(2, 2), "token_mask", 2.0, 1.0)
    with pytest.raises(ValueError, match="must be set for a \\*_truncate mode"):
        vllm_importance_sampling_ratio(r.view(2, 2), r.view(2, 2), r.view(2, 2), "token_truncate", None, None)
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="ref_logps"):
        grpo_loss(lp, torch.zeros(2), torch.ones(2, 3), GRPOLossSettings(beta=0.1))
    with pytest.raises(ValueError, match="entropies"):
        grpo_loss(lp, torch.zeros(2), torch.ones(2, 3), GRPOLossSettings(top_entropy_quantile=0.5))
    with pytest.raises(ValueError, match="token_truncate"):
        grpo_loss(
            lp,
            torch.zeros(2),
            torch.ones(2, 3),
            GRPOLossSettings(loss_type="vespo"),
            importance_sampling_ratio=torch.ones(2, 1),
        )
    assert GRPOLossSettings(loss_type="luspo").warnings() and not GRPOLossSettings(loss_type="grpo").warnings()


# ---------------------------------------------------------------------------------------------------- the field table
def test_coming_from_grpo_trainer_table_covers_every_field():
    """docs/magrpo.md's "Coming from `GRPOTrainer`" table names exactly TRL's own `GRPOConfig` fields (those not
    inherited from `TrainingArguments`); a row that says "same" names only `MAGRPOConfig` fields, and every other field
    is one `MAGRPOConfig` refuses with a pointer (`trl_settings`)."""
    import dataclasses
    import re
    from pathlib import Path

    import transformers
    from trl import GRPOConfig

    from trl_marl import MAGRPOConfig
    from trl_marl.trainers.trl_settings import TRL_CONFIG_SETTINGS

    page = (Path(__file__).resolve().parents[1] / "docs" / "magrpo.md").read_text()
    section = page.split("## Coming from `GRPOTrainer`", 1)[1].split("\n## ", 1)[0]
    inherited = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    own = [f.name for f in dataclasses.fields(GRPOConfig) if f.name not in inherited]
    ours = {f.name for f in dataclasses.fields(MAGRPOConfig)}
    named = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first, meaning = line.split("|")[1:3]
        fields = re.findall(r"`([a-z_0-9]+)`", first)
        named += fields
        if meaning.strip().startswith("same"):
            assert set(fields) <= ours, (fields, "said the same but not MAGRPOConfig fields")
    assert sorted(named) == sorted(own), set(named) ^ set(own)
    for name in own:
        assert name in ours or name in TRL_CONFIG_SETTINGS, name


# ------------------------------------------------------------------------------------------ a batch in parts
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize(
    "overrides",
    [{}, {"beta": 0.04, "entropy_coef": 0.01}, {"importance_sampling_level": "sequence", "delta": 1.5}],
    ids=["plain", "kl-entropy", "sequence"],
)
def test_the_losses_of_a_batchs_parts_add_up_to_its_loss(loss_type, overrides):
    """With the batch's totals (`BatchTotals`) the parts of a batch (rows cut anywhere, one part with no scored
    token) give losses that add up to the batch's loss, and gradients that add up to its gradient."""
    if loss_type == "vespo" and overrides.get("importance_sampling_level") == "sequence":
        pytest.skip("vespo is token-level")
    settings = GRPOLossSettings(loss_type=loss_type, max_completion_length=7, **overrides)
    g = torch.Generator().manual_seed(3)
    B, T = 9, 7
    logps = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)
    old = logps.detach() + 0.3 * torch.randn(B, T, generator=g)
    ref = logps.detach() + 0.2 * torch.randn(B, T, generator=g)
    entropies = torch.rand(B, T, generator=g).requires_grad_(True)
    adv = torch.randn(B, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[4] = 0.0  # a row with nothing scored
    kwargs = dict(settings=settings, token_normalizer=None if loss_type != "dapo" else torch.tensor(23.0))

    def loss_of(rows, totals=None):
        return grpo_loss(
            logps[rows], adv[rows], mask[rows], old_logps=old[rows], ref_logps=ref[rows], entropies=entropies[rows],
            totals=totals, **kwargs,
        )[0]  # fmt: skip

    whole = loss_of(slice(None))
    whole_grads = torch.autograd.grad(whole, [logps, entropies], allow_unused=True)
    totals = BatchTotals(B, float(mask.sum()))
    parts = [loss_of(slice(a, b), totals) for a, b in ((0, 4), (4, 5), (5, 9))]
    part_grads = torch.autograd.grad(sum(parts), [logps, entropies], allow_unused=True)
    torch.testing.assert_close(sum(parts), whole, rtol=1e-6, atol=1e-7)
    for a, b in zip(part_grads, whole_grads):
        if b is None:
            assert a is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)


def test_the_entropy_quantile_refuses_parts():
    """`top_entropy_quantile < 1` takes its quantile over the whole batch: a part's loss would use another one."""
    settings = GRPOLossSettings(loss_type="grpo", top_entropy_quantile=0.5)
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        grpo_loss(x, torch.zeros(2), torch.ones(2, 3), settings, entropies=x, totals=BatchTotals(4, 12.0))


def test_the_entropy_bonus_refuses_parts_with_an_entropy_mask():
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match="entropy quantile's mask needs the whole batch"):
        entropy_bonus(x, x, entropy_mask=x.bool(), totals=BatchTotals(4, 12.0))


def test_a_part_of_the_seed_loss_is_its_share():
    seq, adv = torch.tensor([1.0, -2.0, 3.0, 0.5]), torch.tensor([0.5, 1.0, -1.0, 2.0])
    parts = policy_gradient_loss(seq[:1], adv[:1], 4) + policy_gradient_loss(seq[1:], adv[1:], 4)
    assert parts.item() == pytest.approx(policy_gradient_loss(seq, adv).item())
