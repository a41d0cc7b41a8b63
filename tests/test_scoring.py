"""`trl_marl.models.scoring`: each prompt scored once for its samples, and the rows in checkpointed chunks. Both must
give the log-probs, entropies and gradients of one plain forward over `[prompt | completion]` per row."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_marl.data_types.batches import collate_agent_batch
from trl_marl.models import scoring
from trl_marl.models.scoring import chunk_plan, prompt_groups, score_completions


@pytest.fixture(scope="module")
def model(tiny_path_module):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_path_module).train()


@pytest.fixture(scope="module")
def tiny_path_module():
    from trl_marl.testing import tiny_model_path

    return tiny_model_path()


def grouped_batch(G: int = 4, seed: int = 0, tool_row: int | None = None):
    """3 prompts of different lengths (left padding), G samples each of different lengths; `tool_row`'s middle
    completion tokens are tool results (attended, not scored)."""
    g = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for length in (5, 9, 3):
        prompt = torch.randint(3, 200, (length,), generator=g)
        for _ in range(G):
            prompts.append(prompt)
            completions.append(torch.randint(3, 200, (int(torch.randint(2, 8, (1,), generator=g)),), generator=g))
    masks = None
    if tool_row is not None:
        completions[tool_row] = torch.randint(3, 200, (7,), generator=g)
        masks = [None] * len(completions)
        masks[tool_row] = torch.tensor([1, 1, 0, 0, 1, 1, 1])
    return collate_agent_batch(prompts, completions, 0, masks)


def plain_scores(model, batch, temperature=0.7):
    """One forward over `[prompt | completion]` per row: the reference."""
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    C = batch.num_completion_tokens
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids,
        logits_to_keep=C + 1,
        use_cache=False,
    )
    logp = torch.log_softmax(out.logits[:, :-1].float() / temperature, -1)
    return logp.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)


def grads(model, loss):
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def weighted(logp, batch):
    w = torch.arange(1, logp.shape[0] + 1, dtype=logp.dtype).unsqueeze(1)
    return (logp * w * batch.completion_mask).sum()


def test_prompt_groups_are_the_runs_of_equal_prompts():
    assert prompt_groups(grouped_batch(G=4)).tolist() == [4, 4, 4]


@pytest.mark.parametrize("rows", [None, 3, 5, 1])
def test_shared_prompts_and_chunks_give_the_plain_forward_scores_and_gradients(model, rows):
    """Shared prompts (each run once for its 4 samples, its KV cache repeated) and chunks of `rows` rows (all but the
    last recomputed in the backward): the log-probs and every parameter's gradient of the plain forward."""
    batch = grouped_batch(tool_row=6)
    expected = plain_scores(model, batch)
    expected_grad = grads(model, weighted(expected, batch))
    logp, entropy = score_completions(model, batch, 0.7, return_entropy=True, rows=rows)
    mask = batch.completion_mask.bool()
    assert torch.allclose(logp[mask], expected[mask], atol=1e-5)
    assert entropy.shape == logp.shape and not entropy.requires_grad
    torch.testing.assert_close(grads(model, weighted(logp, batch)), expected_grad, rtol=1e-5, atol=2e-4)


@pytest.mark.parametrize("shared", [True, False])
def test_the_last_completion_token_is_not_run(model, monkeypatch, shared):
    """Nothing the last completion token predicts is scored, so no forward runs it: the completion forward of the
    shared path takes C - 1 tokens, the plain one P + C - 1 (each token also costs its backward). The scores are
    still the plain forward's, completions of one token included."""
    if not shared:
        monkeypatch.setattr(scoring, "prompt_groups", lambda b: torch.ones(b.input_ids.shape[0], dtype=torch.long))
    widths: list[int] = []
    hook = model.model.register_forward_pre_hook(
        lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        for batch in (grouped_batch(G=4), grouped_batch(G=4, seed=1)):
            widths.clear()
            logp = score_completions(model, batch, 0.7)[0]
            P, C = batch.input_ids.shape[1] - batch.num_completion_tokens, batch.num_completion_tokens
            assert widths == ([P, C - 1] if shared else [P + C - 1])
            mask = batch.completion_mask.bool()
            assert torch.allclose(logp[mask], plain_scores(model, batch)[mask], atol=1e-5)
    finally:
        hook.remove()
    one = collate_agent_batch([torch.tensor([5, 6, 7])] * 2, [torch.tensor([9]), torch.tensor([11])], 0)
    logp = score_completions(model, one, 0.7)[0]
    assert logp.shape == (2, 1) and torch.allclose(logp, plain_scores(model, one), atol=1e-5)


def test_chunked_scoring_keeps_one_chunk_of_activations(model):
    """What the forward keeps for the backward (autograd's saved tensors): with chunks of 2 rows, the checkpointed
    chunks keep their inputs only, so the peak is a fraction of the one-forward graph's."""

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def saved_bytes(rows):
        storages = {}

        def pack(t):  # activations: the storages saved for the backward, the weights left out
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights:
                storages[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            score_completions(model, batch, 0.7, rows=rows)
        return sum(storages.values())

    batch = grouped_batch(G=4)
    whole, chunked = saved_bytes(12), saved_bytes(2)
    assert chunked < 0.25 * whole, (chunked, whole)  # measured 0.13: one 2-row chunk of 12 rows, and inputs


@pytest.mark.parametrize(("rows", "recomputed"), [(5, 7), (4, 8), (12, 0)])
def test_the_backward_recomputes_all_but_one_full_chunk(model, monkeypatch, rows, recomputed):
    """The last chunk's graph is kept and the others are recomputed in the backward; the short chunk runs first, so
    the kept one is full and the backward recomputes `B - rows` rows (12 rows in chunks of 5: 7; the old order, the
    short chunk last, recomputed 10). The scores are those of one forward."""
    batch = grouped_batch(G=4)
    sizes: list[int] = []
    real = scoring._score

    def counted(model, chunk, *args, **kwargs):
        sizes.append(chunk.input_ids.shape[0])
        return real(model, chunk, *args, **kwargs)

    monkeypatch.setattr(scoring, "_score", counted)
    logp = score_completions(model, batch, 0.7, rows=rows)[0]
    forward = list(sizes)
    weighted(logp, batch).backward()
    model.zero_grad(set_to_none=True)
    assert sum(forward) == 12 and forward[-1] == min(rows, 12)
    assert sum(sizes[len(forward) :]) == recomputed, sizes
    mask = batch.completion_mask.bool()
    assert torch.allclose(logp[mask], plain_scores(model, batch)[mask], atol=1e-5)


def test_the_automatic_plan_is_one_forward_within_the_budget_and_group_aligned_chunks_above(model, monkeypatch):
    batch = grouped_batch(G=4)
    assert chunk_plan([model, model], [batch, None]) == [(12, True), None]
    assert chunk_plan([model, model], [batch, batch], rows=5) == [(5, False), (5, True)]
    per_row, group = scoring._per_row(model, batch)
    monkeypatch.setattr(scoring, "budget_bytes", lambda m: 9 * per_row)  # 9 rows fit: two groups of 4
    assert chunk_plan([model, model], [batch, batch]) == [(8, False), (8, True)]
    monkeypatch.setattr(scoring, "budget_bytes", lambda m: 3 * per_row)  # not a group: as many rows as fit
    assert chunk_plan([model], [batch]) == [(3, True)]


def test_sharded_agents_are_one_forward_each_whatever_the_budget(model, monkeypatch):
    """ZeRO-3 / FSDP2: processes holding different numbers of rows must run the same forwards of each agent (each
    gathers the agent's shards): chunks sized from each process's rows made rank 1 recompute an agent in the
    backward that rank 0 did not (a gloo size mismatch, test_agentic_training's uneven episodes under ZeRO-3)."""
    batch = grouped_batch(G=4)
    monkeypatch.setattr(scoring, "budget_bytes", lambda m: 1)  # nothing fits: unsharded, every row is a chunk
    assert chunk_plan([model, model], [batch, batch]) == [(1, False), (1, True)]
    monkeypatch.setattr(scoring, "is_sharded", lambda m: True)
    assert chunk_plan([model, model], [batch, batch]) == [(12, True), (12, True)]
    assert chunk_plan([model, model], [None, batch], rows=2) == [None, (12, True)]


def test_logprob_batch_size_is_refused_on_sharded_teams(tmp_path):
    from trl_marl import MAGRPOConfig
    from trl_marl.trainers.arguments import check_sharded_scoring

    args = MAGRPOConfig(output_dir=str(tmp_path), logprob_batch_size=4, report_to="none")
    check_sharded_scoring(args, sharded=False)
    with pytest.raises(ValueError, match=r"logprob_batch_size=4 is not supported with DeepSpeed ZeRO-3 or FSDP2"):
        check_sharded_scoring(args, sharded=True)
    args.logprob_batch_size = None
    check_sharded_scoring(args, sharded=True)


def test_logprob_batch_size_is_checked(tmp_path):
    from trl_marl import MAGRPOConfig

    with pytest.raises(ValueError, match=r"logprob_batch_size must be None \(sized from memory\) or >= 1, got 0"):
        MAGRPOConfig(output_dir=str(tmp_path), logprob_batch_size=0, report_to="none")


def test_shared_prefill_generates_the_samples_of_plain_generate(model):
    """transformers' `generate` with G samples per prompt, against the same call with each prompt's KV cache computed
    once and repeated (`hf._shared_prefill`): the same tokens for the same seed."""
    from transformers import GenerationConfig

    from trl_marl.generation import hf

    batch = grouped_batch(G=1)
    P = batch.input_ids.shape[1] - batch.num_completion_tokens
    ids, mask = batch.input_ids[:, :P], batch.attention_mask[:, :P]
    config = GenerationConfig(
        do_sample=True, max_new_tokens=8, num_return_sequences=4, pad_token_id=0, eos_token_id=None, top_k=0
    )
    torch.manual_seed(3)
    shared = hf._generate(model, ids, mask, config, synced=False)
    original = hf._shared_prefill
    hf._shared_prefill = lambda *a: {}
    try:
        torch.manual_seed(3)
        plain = hf._generate(model, ids, mask, config, synced=False)
    finally:
        hf._shared_prefill = original
    assert shared.shape == plain.shape == (12, 8)
    assert torch.equal(shared, plain)


def test_backward_parts_are_whole_prompt_groups_sized_from_the_budget(model, monkeypatch):
    """The parts of a loss backpropagated part by part: `logprob_batch_size` rows each; None: the batch whole within
    the budget, above it as many whole prompt groups as the budget holds (rows where a group does not fit)."""
    batch = grouped_batch(G=4)
    assert scoring.backward_parts(model, batch, rows=5) == [(0, 5), (5, 10), (10, 12)]
    assert scoring.backward_parts(model, batch) == [(0, 12)]  # the tiny model's budget holds it
    per_row, group = scoring._per_row(model, batch)
    monkeypatch.setattr(scoring, "budget_bytes", lambda m: 9 * per_row)  # 9 rows: two groups of 4
    assert scoring.backward_parts(model, batch) == [(0, 8), (8, 12)]
    monkeypatch.setattr(scoring, "budget_bytes", lambda m: 3 * per_row)  # less than a group: as many rows as fit
    assert scoring.backward_parts(model, batch) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    monkeypatch.setattr(scoring, "is_sharded", lambda m: True)
    monkeypatch.setattr(scoring, "budget_bytes", lambda m: 1)
    assert scoring.backward_parts(model, batch) == [(0, 12)]
