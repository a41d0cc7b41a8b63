"""The team module: masked log-probs (EOS scored, prompt and post-EOS padding not) and gradient isolation."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_marl.algorithms import sequence_logprobs
from trl_marl.data_types.batches import collate_agent_batch
from trl_marl.models.loading import load_tokenizers, loading_kwargs
from trl_marl.models.team import TeamModel, agent_token_logprobs
from trl_marl.rollout.prompts import resolve_formatters


@pytest.fixture
def model(tiny_path):
    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()


def _reference_logprob(model, prompt, completion):
    """Sum of log p(completion_t | prefix) with an unpadded forward pass of prompt + completion."""
    ids = torch.cat([prompt, completion]).unsqueeze(0)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logp.gather(1, completion.unsqueeze(1)).sum().item()


def test_eos_is_scored_and_prompt_and_padding_are_not(model):
    eos = model.config.eos_token_id
    prompts = [torch.tensor([10, 11, 12, 13, 14]), torch.tensor([20, 21])]
    completions = [torch.tensor([30, 31, eos]), torch.tensor([40, 41, 42, 43, 44, eos])]
    batch = collate_agent_batch(prompts, completions, pad_token_id=0)
    # prompts are left-padded, completions right-padded after their EOS
    assert batch.input_ids[1, :3].tolist() == [0, 0, 0]
    assert batch.completion_mask[0].tolist() == [1, 1, 1, 0, 0, 0]
    with torch.no_grad():
        seq = sequence_logprobs(agent_token_logprobs(model, batch), batch.completion_mask)
    for r in range(2):
        expected = _reference_logprob(model, prompts[r], completions[r])
        assert seq[r].item() == pytest.approx(expected, abs=1e-4)
    # dropping the EOS changes the score: it is counted
    without_eos = _reference_logprob(model, prompts[0], completions[0][:-1])
    assert abs(seq[0].item() - without_eos) > 1e-3


def test_post_eos_tokens_do_not_change_the_score(model):
    eos = model.config.eos_token_id
    prompt = torch.tensor([10, 11, 12])
    a = collate_agent_batch([prompt, prompt], [torch.tensor([30, eos]), torch.tensor([30, 31, 32, 33])], 0)
    # same first row, but pad the batch to another length with garbage in the padded region
    a.input_ids[0, -2:] = torch.tensor([99, 98])
    a.completion_ids[0, -2:] = torch.tensor([99, 98])
    with torch.no_grad():
        s = sequence_logprobs(agent_token_logprobs(model, a), a.completion_mask)
    expected = _reference_logprob(model, prompt, torch.tensor([30, eos]))
    assert s[0].item() == pytest.approx(expected, abs=1e-4)


def test_each_agent_gradient_touches_only_its_own_parameters(tiny_path):
    agents = [AutoModelForCausalLM.from_pretrained(tiny_path) for _ in range(2)]
    team = TeamModel(agents)
    batch = collate_agent_batch([torch.tensor([5, 6, 7])] * 2, [torch.tensor([8, 9, 1]), torch.tensor([8, 1])], 0)
    logps = team([batch, batch])["logprobs"]
    seqs = [sequence_logprobs(lp, batch.completion_mask) for lp in logps]
    # loss of agent 1 alone -> no gradient on agent 2
    (-seqs[0].mean()).backward(retain_graph=True)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in agents[0].parameters() if p.requires_grad)
    assert all(p.grad is None for p in agents[1].parameters())
    g0 = [p.grad.clone() for p in agents[0].parameters()]
    # the gradient of the sum on agent 1 equals agent 1's own gradient
    for p in agents[0].parameters():
        p.grad = None
    (-seqs[0].mean() - seqs[1].mean()).backward()
    for p, g in zip(agents[0].parameters(), g0):
        torch.testing.assert_close(p.grad, g)


def test_team_forward_skips_none_and_checks_length(tiny_path):
    team = TeamModel([AutoModelForCausalLM.from_pretrained(tiny_path) for _ in range(2)])
    batch = collate_agent_batch([torch.tensor([5])], [torch.tensor([6, 1])], 0)
    out = team([None, batch])["logprobs"]
    assert out[0] is None and out[1].shape == (1, 2)
    with pytest.raises(ValueError, match="expected 2 agent batches"):
        team([batch])


def test_formatters_and_tokenizers_validation(tiny_tokenizer):
    assert len(resolve_formatters(None, 3)) == 3
    with pytest.raises(ValueError, match="formatters has 1 entries but num_agents is 2"):
        resolve_formatters([lambda x: x], 2)
    with pytest.raises(ValueError, match="tokenizer list has 3 entries but num_agents is 2"):
        load_tokenizers([tiny_tokenizer] * 3, ["a", "b"], 2, ["a", "b"])


def test_loading_kwargs():
    assert loading_kwargs({"dtype": "bfloat16", "attn_implementation": "eager"}) == {
        "dtype": torch.bfloat16,
        "attn_implementation": "eager",
    }
    with pytest.raises(ValueError, match="unknown keys \\['flash'\\]"):
        loading_kwargs({"flash": True})
