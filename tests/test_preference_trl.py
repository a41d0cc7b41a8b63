"""The preference half on TRL's machinery: TRL's preference format, TRL's DPO loss family on the joint margin,
reference models, the joint reward model fitted by TRL's RewardTrainer, and round trips with TRL's trainers."""

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from trl_marl import MADPOConfig, MADPOTrainer
from trl_marl.trainers.preference import PreferencePair
from trl_marl.trainers.preference.pairs import joint_prompt_text, joint_response_text, to_dataset
from trl_marl.trainers.preference.reward_model import joint_text


def length_reward(c1, c2):
    return [float(len(a) - len(b)) for a, b in zip(c1, c2)]


def _pairs(chat: bool = False, n: int = 2, count: int = 3) -> list[PreferencePair]:
    out = []
    for j in range(count):
        prompts = [f"agent {i} task {j}" for i in range(n)]
        msgs = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": p}] for p in prompts]
        out.append(
            PreferencePair(
                prompts=prompts,
                winner_completions=[f"good {i} {j}" for i in range(n)],
                loser_completions=[f"bad {i} {j}" for i in range(n)],
                winner_reward=1.0 + j,
                loser_reward=0.5 * j,
                candidate_reward_mean=0.25,
                prompt_messages=msgs if chat else None,
            )
        )
    return out


def _texts(p: PreferencePair):
    return (
        p.prompts,
        p.winner_completions,
        p.loser_completions,
        p.winner_reward,
        p.loser_reward,
        p.candidate_reward_mean,
    )


# ---------------------------------------------------------------- TRL's preference format
def test_joint_dataset_is_trl_preference_format_and_round_trips():
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    pairs = _pairs()
    ds = to_dataset(pairs)
    assert ds.column_names[:3] == ["prompt", "chosen", "rejected"]
    row = ds[0]
    assert not is_conversational(row)
    # prompt + chosen is exactly the transcript the joint reward model scores
    assert row["prompt"] + row["chosen"] == joint_text(pairs[0].prompts, pairs[0].winner_completions)
    assert row["prompt"] == joint_prompt_text(pairs[0].prompts)
    assert row["rejected"] == joint_response_text(pairs[0].loser_completions)
    assert maybe_apply_chat_template(row, None) == row  # plain text passes through unchanged
    back = PreferencePair.from_dataset(ds)
    assert [_texts(p) for p in back] == [_texts(p) for p in pairs]


def test_per_agent_datasets_round_trip_and_conversational_form(tiny_path):
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    tok = AutoTokenizer.from_pretrained(tiny_path)
    for chat in (False, True):
        pairs = _pairs(chat=chat, n=3)
        per_agent = [to_dataset(pairs, agent=i) for i in range(3)]
        row = per_agent[1][2]
        assert is_conversational(row) is chat
        if chat:
            assert row["prompt"] == pairs[2].prompt_messages[1]
            assert row["chosen"] == [{"role": "assistant", "content": "good 1 2"}]
            rendered = maybe_apply_chat_template(row, tok)  # TRL's own helper accepts it
            assert rendered["prompt"].endswith("<|im_start|>assistant\n")
            assert rendered["chosen"].startswith("good 1 2")
            joint = to_dataset(pairs)[0]
            assert is_conversational(joint) and joint["prompt"][0]["role"] == "user"
            assert "agent 2 task 0" in maybe_apply_chat_template(joint, tok)["prompt"]
        else:
            assert row == {
                "prompt": "agent 1 task 2",
                "chosen": "good 1 2",
                "rejected": "bad 1 2",
                "winner_reward": 3.0,
                "loser_reward": 1.0,
                "candidate_reward_mean": 0.25,
            }
        back = PreferencePair.from_dataset(per_agent)
        assert [p.winner_completions for p in back] == [p.winner_completions for p in pairs]
        assert [p.loser_completions for p in back] == [p.loser_completions for p in pairs]
        assert [p.winner_reward for p in back] == [p.winner_reward for p in pairs]
        if chat:
            assert [p.prompt_messages for p in back] == [p.prompt_messages for p in pairs]
        else:
            assert [p.prompts for p in back] == [p.prompts for p in pairs]
    with pytest.raises(ValueError, match="agent"):
        to_dataset(pairs, agent=3)
    with pytest.raises(ValueError, match="agent_prompts"):
        PreferencePair.from_dataset(per_agent[0])


def test_collected_pairs_export_and_retokenize_to_the_sampled_ids(make_args, items, tiny_path):
    args = make_args(MADPOConfig, preference_num_candidates=3, preference_pairs_per_sample=2)
    t = MADPOTrainer(agent_model=tiny_path, reward_func=length_reward, args=args, train_dataset=items)
    pairs = t.collect_preference_pairs()
    back = PreferencePair.from_dataset(to_dataset(pairs), trainer=t)
    assert len(back) == len(pairs)
    for a, b in zip(pairs, back):
        assert _texts(a) == _texts(b)
        for i in range(2):
            assert torch.equal(a.prompt_ids[i], b.prompt_ids[i])
    # chat-template formatters: collected pairs keep the messages and export conversationally
    chat = MADPOTrainer(
        agent_model=tiny_path,
        reward_func=length_reward,
        args=args,
        train_dataset=items,
        formatters=lambda item: [{"role": "user", "content": item["prompt"]}],
    )
    pairs = chat.collect_preference_pairs()
    from trl.data_utils import is_conversational

    assert pairs and all(p.prompt_messages for p in pairs)
    assert is_conversational(to_dataset(pairs, agent=0)[0])
    back = PreferencePair.from_dataset([to_dataset(pairs, agent=i) for i in range(2)], trainer=chat)
    assert [str(p) for p in back[0].prompts] == [str(p) for p in pairs[0].prompts]  # re-rendered by the template
    assert torch.equal(back[0].prompt_ids[1], pairs[0].prompt_ids[1])
