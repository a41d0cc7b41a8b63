"""JointRollout with a scripted generator (no model): joint modes, trees, transitions, returns; the rollout's text
made valid for what writes it (`valid_text`)."""

import pytest
import torch

from trl_marl.algorithms.advantages import group_advantages
from trl_marl.data_types.rollout import GenerationOutput
from trl_marl.data_types.text import CompletionText, PromptText, valid_text, valid_texts
from trl_marl.rewards import RewardFunction
from trl_marl.rollout.engine import JointRollout, tree_size
from trl_marl.rollout.returns import rollout_returns


class ScriptedGenerate:
    """Completion text of agent i, sample k for prompt p: f"{i}|{k}|{p}". Records every call."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts_per_agent, G):
        self.calls.append([list(p) for p in prompts_per_agent])
        outs = []
        for i, prompts in enumerate(prompts_per_agent):
            texts = [f"{i}|{k}|{p}" for p in prompts for k in range(G)]
            ids = [torch.tensor([i, k]) for _ in prompts for k in range(G)]
            outs.append(GenerationOutput(texts, [torch.tensor([7])] * len(texts), ids))
        return outs


def sample_index(text):
    return int(text.split("|")[1])


def make(n=2, G=2, reward=None, **kw):
    calls = []

    def default_reward(*completions):
        calls.append(len(completions[0]))
        # joint reward = sum of the agents' sample indices
        return [float(sum(sample_index(c[j]) for c in completions)) for j in range(len(completions[0]))]

    fn = RewardFunction(reward or default_reward, n)
    ro = JointRollout(
        num_agents=n,
        formatters=[lambda item, i=i: f"A{i}:{item['prompt']}" for i in range(n)],
        render=lambda i, x: PromptText(x),
        reward=fn,
        num_generations=G,
        **kw,
    )
    return ro, calls


ITEMS = [{"prompt": "p0"}, {"prompt": "p1"}]


def test_aligned_gives_G_joint_actions_one_generate_and_one_reward_call():
    ro, calls = make(G=3)
    gen = ScriptedGenerate()
    out = ro.run(ITEMS, gen)
    assert len(out.nodes) == 2
    assert all(node.joint == [(0, 0), (1, 1), (2, 2)] for node in out.nodes)
    assert len(gen.calls) == 1 and gen.calls[0] == [["A0:p0", "A0:p1"], ["A1:p0", "A1:p1"]]
    assert calls == [6]  # one reward call covering both items' joint actions
    assert out.env_steps == 6
    assert out.nodes[0].rewards.tolist() == [0.0, 2.0, 4.0]


def test_cross_gives_G_to_the_n_joint_actions():
    ro, calls = make(n=3, G=2, joint_mode="cross")
    out = ro.run(ITEMS[:1], ScriptedGenerate())
    assert len(out.nodes[0].joint) == 8
    assert out.nodes[0].joint[5] == (1, 0, 1)  # row-major product
    assert calls == [8]


def test_cross_sample_return_is_mean_of_joint_returns_containing_it():
    ro, _ = make(G=2, joint_mode="cross")
    out = ro.run(ITEMS[:1], ScriptedGenerate())
    returns = rollout_returns(out)
    # joint rewards k1 + k2 over (0,0),(0,1),(1,0),(1,1) = 0,1,1,2 ; agent 0 sample 0 -> mean(0,1) = 0.5
    assert returns.of_node(0, 0).tolist() == [0.5, 1.5]
    assert group_advantages(returns.of_node(0, 0), "mean").tolist() == [-0.5, 0.5]


def test_multi_turn_tree_sizes_and_batched_generation():
    seen = []

    def transition(**kwargs):
        seen.append(kwargs)
        return [f"next{i}" for i in range(kwargs["num_agents"])]

    ro, calls = make(G=2, num_turns=3, external_transition=transition)
    gen = ScriptedGenerate()
    out = ro.run(ITEMS, gen)
    # per item 1 + 2 + 4 nodes
    assert len(out.nodes) == 2 * 7
    assert [len(c[0]) for c in gen.calls] == [2, 4, 8]  # one generate per turn over all nodes of all items
    assert calls == [4, 8, 16]
    assert tree_size(2, 2, 3, "aligned") == 2 + 4 + 8
    assert len(seen) == 2 * (2 + 4)


def test_transition_receives_the_exact_arguments():
    seen = []

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        seen.append(
            dict(
                prompt=prompt,
                agent_completions=agent_completions,
                num_agents=num_agents,
                prompt_history_per_agent=prompt_history_per_agent,
                response_history_per_agent=response_history_per_agent,
            )
        )
        return ["fb0", "fb1"]

    ro, _ = make(G=1, num_turns=3, external_transition=transition)
    out = ro.run(ITEMS[:1], ScriptedGenerate())
    assert seen[0] == {
        "prompt": "p0",
        "agent_completions": ["0|0|A0:p0", "1|0|A1:p0"],
        "num_agents": 2,
        "prompt_history_per_agent": [["A0:p0"], ["A1:p0"]],
        "response_history_per_agent": [["0|0|A0:p0"], ["1|0|A1:p0"]],
    }
    # by default the returned prompt goes through the formatter as item["prompt"]
    assert out.nodes[1].prompts == ["A0:fb0", "A1:fb1"]
    assert seen[1]["prompt_history_per_agent"] == [["A0:p0", "A0:fb0"], ["A1:p0", "A1:fb1"]]
    assert seen[1]["response_history_per_agent"][0] == ["0|0|A0:p0", "0|0|A0:fb0"]


def test_prompt_passthrough_uses_transition_prompts_verbatim():
    ro, _ = make(G=1, num_turns=2, external_transition=lambda **kw: ["raw0", "raw1"], external_prompt_passthrough=True)
    out = ro.run(ITEMS[:1], ScriptedGenerate())
    assert out.nodes[1].prompts == ["raw0", "raw1"]


def test_transition_with_wrong_count_is_an_error():
    ro, _ = make(G=1, num_turns=2, external_transition=lambda **kw: ["only one"])
    with pytest.raises(ValueError, match="list of 2 prompts"):
        ro.run(ITEMS[:1], ScriptedGenerate())


def test_early_termination_stops_a_branch():
    def reward(c1, c2):  # item p1 scores 5, item p0 scores 0
        return [5.0 if c1[j].endswith("p1") else 0.0 for j in range(len(c1))]

    ro, _ = make(
        G=2, num_turns=2, reward=reward, external_transition=lambda **kw: ["a", "b"], early_termination_threshold=1.0
    )
    out = ro.run(ITEMS, ScriptedGenerate())
    roots = [n for n in out.nodes if n.turn == 0]
    assert not roots[0].terminated and len(roots[0].children) == 2
    assert roots[1].terminated and roots[1].children == {}
    assert len(out.nodes) == 2 + 2


def test_returns_follow_the_tree_with_discount():
    def reward(c1, c2):
        # turn 1 prompts start with "A0:p", turn 2 with "A0:x": reward 1 at turn 1, 2 * k at turn 2
        return [1.0 if "|A0:p" in c1[j] else 2.0 * sample_index(c1[j]) for j in range(len(c1))]

    ro, _ = make(G=2, num_turns=2, reward=reward, external_transition=lambda **kw: ["x", "y"])
    out = ro.run(ITEMS[:1], ScriptedGenerate())
    returns = rollout_returns(out, discount=0.5)
    root = out.nodes[0]
    # children rewards are (0, 2): mean 1 -> root returns 1 + 0.5 * 1 = 1.5 for each joint action
    assert returns.joint[root.id][:, 0].tolist() == [1.5, 1.5]
    assert returns.team_to_go[root.id].tolist() == [2.0, 2.0]
    child = out.nodes[root.children[0]]
    assert returns.joint[child.id][:, 1].tolist() == [0.0, 2.0]
    assert group_advantages(returns.of_node(child.id, 0), "mean").tolist() == [-1.0, 1.0]
    assert out.turn_metrics(returns.team_to_go)["turn_1/expected_return"] == 2.0


def test_penalties_enter_per_agent_returns():
    ro, _ = make(G=2)
    out = ro.run(ITEMS[:1], ScriptedGenerate())
    for sid in out.nodes[0].samples[1]:
        out.samples[sid].penalty = 0.25
    returns = rollout_returns(out)
    assert returns.joint[out.nodes[0].id].tolist() == [[0.0, -0.25], [2.0, 1.75]]


def test_huge_cross_tree_warns_with_its_size():
    with pytest.warns(UserWarning, match="up to 4160 joint actions"):
        make(n=3, G=4, joint_mode="cross", num_turns=2, external_transition=lambda **kw: ["a"] * 3)


def test_multi_turn_needs_a_transition():
    with pytest.raises(ValueError, match="external_transition"):
        make(num_turns=2)


def test_unknown_joint_mode():
    with pytest.raises(ValueError, match="joint_mode must be one of"):
        make(joint_mode="diagonal")


def test_records_are_json_able():
    import json

    ro, _ = make(G=2)
    out = ro.run(ITEMS, ScriptedGenerate())
    recs = out.records(rollout_returns(out).joint)
    assert len(recs) == 4 and recs[0]["completions"] == ["0|0|A0:p0", "1|0|A1:p0"]
    json.dumps(recs)


def test_valid_text_replaces_lone_surrogates_and_keeps_valid_text():
    valid = "café 中文 😀 \x00 \ufffd"
    assert valid_text(valid) is valid and valid_text("ascii") == "ascii"
    completion = CompletionText("héllo", eos_token="</s>")
    assert valid_text(completion) is completion  # unchanged: the same object, its attributes kept
    assert valid_text("a\ud800b\udfff") == "a\ufffdb\ufffd"
    assert valid_text("\ud83d\ude00 \udc00\ud800") == "\U0001f600 \ufffd\ufffd"  # a pair joined; reversed: two
    record = {"k\ud800": ["x\udfff", ("é", 1, None)], "reward": 0.5, "ids": torch.tensor([1])}
    fixed = valid_texts(record)
    assert fixed["k\ufffd"][:1] == ["x\ufffd"] and fixed["k\ufffd"][1] == ("é", 1, None)
    assert fixed["reward"] == 0.5 and fixed["ids"] is record["ids"]
    assert "\ufffd".join(fixed).encode("utf-8")  # every text encodes


def test_a_formatter_that_returns_another_kind_of_prompt_for_a_later_item_names_both_items(tiny_tokenizer):
    """Audit: a custom formatter's chat messages for one item and a string for another were rendered and generated
    from with one chat setting per agent (`PromptRenderer.chat`, with which preference pairs are re-tokenized) and
    per batch (its first row's): the other kind was mis-tokenized, silently (old code: no error). A transition's
    later-turn prompts may be of another kind (each is tokenized as its own kind)."""
    from trl_marl.rollout.prompts import PromptError, PromptRenderer

    def chat_for_odd(item):
        text = f"Write about {item['topic']}."
        return [{"role": "user", "content": text}] if item["topic"] % 2 else text

    never_scored = RewardFunction(lambda *completions: [0.0] * len(completions[0]), 1)
    engine = JointRollout(1, [chat_for_odd], PromptRenderer([tiny_tokenizer]), never_scored, num_generations=1)
    assert engine.first_prompts({"topic": 2}) == ["Write about 2."]
    assert engine.first_prompts({"topic": 4}) == ["Write about 4."]
    with pytest.raises(
        PromptError,
        match=r"^the task item \{'topic': 3\}: the prompt that agent 1's formatter returns is chat messages, but for "
        r"the task item \{'topic': 2\} it returned a string; an agent's prompts must all be one kind: .* wrap each "
        r"string s as \[\{'role': 'user', 'content': s\}\], or drop the items of the other kind$",
    ):
        engine.first_prompts({"topic": 3})
    assert engine.render(0, [{"role": "user", "content": "a transition's prompt"}]).chat


def test_a_batch_mixing_chat_template_text_and_plain_strings_tokenizes_each_as_its_kind():
    """Audit: `prompt_token_ids` tokenized a whole batch with its first row's setting (TRL's
    `is_conversational(inputs[0])`): a plain string after chat-template text lost its special tokens, and vice
    versa (old code: [[5], [5]] and [[1, 5], [1, 5]])."""
    from trl_marl.generation.engine import prompt_token_ids

    def tokenizer(texts, add_special_tokens):
        return {"input_ids": [([1] if add_special_tokens else []) + [5] for _ in texts]}

    chat = PromptText("<|user|>hi")
    chat.chat = True
    assert prompt_token_ids(tokenizer, [chat, PromptText("hi"), "hi", chat], None) == [[5], [1, 5], [1, 5], [5]]
    assert prompt_token_ids(tokenizer, ["hi", chat], None) == [[1, 5], [5]]
