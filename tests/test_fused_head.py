"""`trl_marl.models.fused_head`: completions scored from the LM head's input with TRL's chunked kernel give the
log-probs, entropies and gradients of the materialised logits, never hold a tensor of the vocabulary's size per
token, and leave the model as it was. The fused path runs where Triton does (CUDA); here on CPU it is forced on
(`_triton_runs_on`), and TRL's kernel folds its tiles with torch ops: the same integration, other tile code."""

import pytest
import torch
from test_scoring import grads, grouped_batch, plain_scores, weighted
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from trl_marl.models import fused_head as fused_head_module
from trl_marl.models.fused_head import VOCAB_TILE, fused_head
from trl_marl.models.scoring import score_completions
from trl_marl.testing import tiny_model_path

WIDE = VOCAB_TILE + 7_000  # one tile and a part: the kernel's tile loop runs twice, the last tile partial


@pytest.fixture(autouse=True)
def triton_device(monkeypatch):
    """The fused path taken as on a CUDA device."""
    monkeypatch.setattr(fused_head_module, "_triton_runs_on", lambda device: True)


def materialised(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(fused_head_module, "_triton_runs_on", lambda device: False)


@pytest.fixture(scope="module")
def wide_model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_path(vocab_size=WIDE)).train()


@pytest.fixture(scope="module")
def narrow_model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_path()).train()


class LargestOutput(TorchDispatchMode):
    """The largest tensor any operation produced (forward and backward run on this thread on CPU)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def entropy_reference(model, batch, temperature=0.7):
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    C = batch.num_completion_tokens
    with torch.no_grad():
        logits = (
            model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=position_ids,
                logits_to_keep=C + 1,
                use_cache=False,
            )
            .logits[:, :-1]
            .float()
        )
    logp = torch.log_softmax(logits / temperature, -1)
    return -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("rows", [None, 5])
def test_fused_scores_are_the_materialised_logits_scores(wide_model, rows):
    """Shared prompts, chunks of 5 rows (checkpointed), a tool-result row: the log-probs, entropies and every
    parameter's gradient (the tied head's included) of one plain forward over full logits."""
    assert fused_head(wide_model) is not None
    batch = grouped_batch(tool_row=6)
    expected = plain_scores(wide_model, batch)
    expected_grad = grads(wide_model, weighted(expected, batch))
    logp, entropy = score_completions(wide_model, batch, 0.7, return_entropy=True, rows=rows)
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(logp[mask], expected[mask], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[mask], entropy_reference(wide_model, batch)[mask], atol=2e-5, rtol=1e-5)
    assert not entropy.requires_grad
    torch.testing.assert_close(grads(wide_model, weighted(logp, batch)), expected_grad, rtol=1e-4, atol=2e-5)


def test_the_entropy_bonus_gradient_flows_through_the_kernel(wide_model):
    """`entropy_grad=True` (TRL's entropy bonus): the entropy's gradient equals the materialised path's."""
    batch = grouped_batch()
    mask = batch.completion_mask
    _, fused = score_completions(wide_model, batch, 0.7, return_entropy=True, entropy_grad=True)
    fused_grad = grads(wide_model, (fused * mask).sum())
    with pytest.MonkeyPatch.context() as mp:
        materialised(mp)
        assert fused_head(wide_model) is None
        _, plain = score_completions(wide_model, batch, 0.7, return_entropy=True, entropy_grad=True)
        plain_grad = grads(wide_model, (plain * mask).sum())
    torch.testing.assert_close(fused_grad, plain_grad, rtol=1e-4, atol=2e-5)


def test_no_tensor_of_the_vocabulary_size_per_token_is_made(wide_model, monkeypatch):
    """Forward and backward of the fused path: no operation produces a tensor as large as the completions' logits
    (rows x completion tokens x vocabulary); the materialised path makes several (the control)."""
    batch = grouped_batch()
    B, C = batch.completion_ids.shape
    logits_numel = B * C * WIDE

    def largest():
        with LargestOutput() as seen:
            logp = score_completions(wide_model, batch, 0.7, return_entropy=True)[0]
            weighted(logp, batch).backward()
        wide_model.zero_grad()
        return seen.largest

    fused = largest()
    materialised(monkeypatch)
    materialised_largest = largest()
    assert materialised_largest >= logits_numel
    # the kernel's largest: one (tokens x tile) tile on CPU, or the head's weight and its gradient
    assert fused <= max(B * C * VOCAB_TILE, WIDE * wide_model.config.hidden_size) < logits_numel, (fused, logits_numel)


def test_the_head_is_back_after_scoring_and_after_a_failed_forward(wide_model, monkeypatch):
    head = wide_model.get_output_embeddings()
    score_completions(wide_model, grouped_batch(), 0.7)
    assert wide_model.get_output_embeddings() is head
    assert head.weight is wide_model.get_input_embeddings().weight  # still tied

    def broken(*args, **kwargs):
        assert not isinstance(wide_model.get_output_embeddings(), torch.nn.Linear)  # swapped while it runs
        raise RuntimeError("forward failed")

    monkeypatch.setattr(wide_model.model, "forward", broken)
    with pytest.raises(RuntimeError, match="forward failed"):
        score_completions(wide_model, grouped_batch(), 0.7)
    assert wide_model.get_output_embeddings() is head


def test_which_models_take_the_fused_path(wide_model, narrow_model, monkeypatch):
    """Where Triton runs, every vocabulary; never without it (the CPU), a model whose forward transforms the head's
    output, a head that is not a plain Linear, or a sharded model."""
    assert fused_head(wide_model) == (wide_model, wide_model.get_output_embeddings())
    assert fused_head(narrow_model) == (narrow_model, narrow_model.get_output_embeddings())
    for field, value in (("final_logit_softcapping", 30.0), ("logit_scale", 0.5), ("logits_scaling", 4.0)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(wide_model.config, field, value, raising=False)
            assert fused_head(wide_model) is None, field
    assert fused_head(wide_model) is not None
    monkeypatch.setattr(fused_head_module, "is_sharded", lambda model: True)
    assert fused_head(wide_model) is None


def test_the_cpu_keeps_the_logits(wide_model, monkeypatch):
    """Without Triton the kernel's torch tiles cost more time and memory than the budgeted logits path (module
    docstring): the CPU is never fused; a CUDA device with Triton is."""
    monkeypatch.undo()  # the real device rule
    assert fused_head(wide_model) is None
    monkeypatch.setattr(fused_head_module, "is_triton_available", lambda: True)
    assert not fused_head_module._triton_runs_on(torch.device("cpu"))
    assert fused_head_module._triton_runs_on(torch.device("cuda", 0))
    monkeypatch.setattr(fused_head_module, "is_triton_available", lambda: False)
    assert not fused_head_module._triton_runs_on(torch.device("cuda", 0))


def test_peft_agents_and_adapter_views_reach_the_causal_lm():
    """A LoRA agent (PEFT's wrapper), a shared base's adapter view and the adapters-off reference all score through
    the fused head of the one causal LM; a LoRA-wrapped head does not (its delta is not the head's weight)."""
    from peft import LoraConfig, get_peft_model

    from trl_marl.models.adapters import AdapterDisabled, build_shared_base

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path(vocab_size=WIDE))
    shared, (first, second) = build_shared_base(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]), 2, "t")
    for view in (first, second, AdapterDisabled(shared)):
        assert fused_head(view) == (base, base.get_output_embeddings())
    batch = grouped_batch()
    mask = batch.completion_mask.bool()
    torch.nn.init.normal_(shared.base_model.model.model.layers[0].self_attn.q_proj.lora_B["agent_2"].weight)
    for view in (first, second):
        with torch.no_grad():
            fused = score_completions(view, batch, 0.7)[0]
            with pytest.MonkeyPatch.context() as mp:
                materialised(mp)
                torch.testing.assert_close(
                    fused[mask], score_completions(view, batch, 0.7)[0][mask], atol=2e-5, rtol=0
                )
    head_lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_path(vocab_size=WIDE)),
        LoraConfig(r=4, target_modules=["q_proj", "lm_head"]),
    )
    assert fused_head(head_lora) is None


def test_a_forward_that_does_not_return_the_heads_input_is_refused():
    """A custom model whose forward does more than `lm_head(hidden)` hands the kernel features of another width:
    a clear error naming both widths, not a silent wrong score."""
    from trl_marl.models.fused_head import head_logprobs

    head = torch.nn.Linear(8, 50, bias=False)
    with pytest.raises(RuntimeError, match="the model returned 6 features per token where its head takes 8"):
        head_logprobs(torch.zeros(2, 3, 6), head, torch.zeros(2, 3, dtype=torch.long), 1.0, entropy=False)
