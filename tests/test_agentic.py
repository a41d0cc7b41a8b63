"""Agentic teams in the trainers: tools, a shared environment and turn order through the rollout and the loss.

Generation is scripted here (`Scripted`: exact completions per agent and round, through the trainer's own
tokenizers), so every token of a rollout is known: the tests check the token layout (generated, then tool-result
tokens masked, then generated again), the number of `generate` calls, the tree, the rewards and the loss against
its formula. The slow tests in tests/test_agentic_training.py train on the tiny model for real.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import torch
from conftest import CALL, END, Scripted, agentic_args, tool_tokenizer

from trl_marl import (
    CentralizedMAGRPOTrainer,
    MAACConfig,
    MAACTrainer,
    MADPOConfig,
    MADPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MAReMaxTrainer,
    MARLHFConfig,
    MARLHFTrainer,
)
from trl_marl.environments import SignalGame, signal_game_dataset


def signal_policy(counter=None):
    """The signaller names its secret; the receiver submits what agent 1 said (or 'red' when it saw nothing), then
    says "Done.". With `counter`, every second receiver submits "dog" instead (not a choice, for a spread)."""

    def policy(agent, text, continued):
        if agent == 0:
            secret = re.search(r"The secret is (\w+)", text).group(1)
            return f"The secret is {secret}.{END}"
        if continued:
            return "Done." + END
        seen = re.search(r"Agent 1: The secret is (\w+)", text)
        answer = seen.group(1) if seen else "red"
        if counter is not None:
            counter[0] += 1
            answer = "dog" if counter[0] % 2 == 0 else answer
        return "Let me submit." + CALL.format(name="submit", args=f'{{"answer": "{answer}"}}')

    return policy


@pytest.fixture
def tok(tiny_path):
    return tool_tokenizer(tiny_path)


class Confirm(SignalGame):
    """The signalling game, where the receiver answers the tool result before the episode ends."""

    def submit(self, answer: str) -> str:
        """Submit the secret.

        Args:
            answer: The secret word.
        """
        out = super().submit(answer)
        self.done = False
        return out


def signal_trainer(tiny_path, tok, tmp_path, env=Confirm, **overrides):
    data = signal_game_dataset(8, secrets=("blue", "cat", "red"))
    return MAGRPOTrainer(
        model=tiny_path,
        args=agentic_args(tmp_path, **overrides),
        train_dataset=data,
        processing_class=tok,
        environment_factory=env,
    )


def test_tool_turn_tokens_masks_and_one_generate_per_position_per_round(tiny_path, tok, tmp_path):
    trainer = signal_trainer(tiny_path, tok, tmp_path, max_tool_calling_iterations=2)
    script = Scripted(trainer, signal_policy())
    items = [trainer.train_dataset[i] for i in range(3)]
    rollout = trainer.train_rollout_engine.run(items, trainer.generation.generate)
    # agent 1 once, agent 2 twice (its call, then its answer to the tool result): every branch in each call
    assert script.calls == [(0, 6), (1, 6), (1, 6)]
    assert len(rollout.nodes) == 3 and all(len(n.joint) == 2 for n in rollout.nodes)
    for node in rollout.nodes:
        assert node.rewards.tolist() == [1.0, 1.0]  # clear signal, a submit, the right answer
    receiver = rollout.samples_of_agent(1)[0]
    call = tok(
        "Let me submit." + CALL.format(name="submit", args=f'{{"answer": "{items[0]["secret"]}"}}'),
        add_special_tokens=False,
    )["input_ids"]
    answer = tok("Done." + END, add_special_tokens=False)["input_ids"]
    ids, mask = receiver.completion_ids.tolist(), receiver.tool_mask.tolist()
    suffix = ids[len(call) : len(ids) - len(answer)]
    assert ids[: len(call)] == call and ids[len(ids) - len(answer) :] == answer
    assert tok.decode(suffix) == "\n<|im_start|>tool\nSubmitted.<|im_end|>\n<|im_start|>assistant\n"
    assert mask == [1] * len(call) + [0] * len(suffix) + [1] * len(answer)  # TRL's tool_mask
    assert receiver.num_generated_tokens == len(call) + len(answer)
    signaller = rollout.samples_of_agent(0)[0]
    assert signaller.tool_mask is None  # no tool: every token generated
    assert f"Agent 1: The secret is {items[0]['secret']}." in receiver.prompt  # sequential: sees agent 1's message
    assert '"name": "submit"' in receiver.prompt and '"name": "submit"' not in signaller.prompt  # tools_for
    m = rollout.metrics
    assert m["agent_2/tools/calls"] == 1 and m["agent_1/tools/calls"] == 0 and m["agent_2/tools/failures"] == 0
    assert m["episodes/ended_by_environment"] == 0 and m["agent_1/env_reward"] == 1.0
    # the batch the loss reads: tool-result tokens attended to, not scored
    batch = trainer.agent_batch(1, [receiver])
    assert batch.completion_mask[0, : len(ids)].tolist() == mask and batch.attention_mask[0, -len(ids) :].all()


class InvalidUnicodeResult(Confirm):
    """The signalling game whose submit tool answers with a lone surrogate (a tool's output is any text)."""

    def submit(self, answer: str) -> str:
        """Submit the secret.

        Args:
            answer: The secret word.
        """
        super().submit(answer)
        return "Submitted \ud800 caf\u00e9."


def test_a_tool_result_with_invalid_unicode_is_read_as_replacement_characters(tiny_path, tok, tmp_path):
    # old code: TypeError (TextEncodeInput must be Union[...]) tokenizing the tool message (tool_suffix_ids)
    trainer = signal_trainer(tiny_path, tok, tmp_path, env=InvalidUnicodeResult, max_steps=1)
    Scripted(trainer, signal_policy())
    items = [trainer.train_dataset[i] for i in range(2)]
    rollout = trainer.train_rollout_engine.run(items, trainer.generation.generate)
    receiver = rollout.samples_of_agent(1)[0]
    result = [t for t, m in zip(receiver.completion_ids.tolist(), receiver.tool_mask.tolist()) if m == 0]
    assert tok.decode(result) == "\n<|im_start|>tool\nSubmitted \ufffd caf\u00e9.<|im_end|>\n<|im_start|>assistant\n"
    trainer.train()
    assert trainer.state.global_step == 1


def test_simultaneous_order_hides_the_same_turn(tiny_path, tok, tmp_path):
    trainer = signal_trainer(tiny_path, tok, tmp_path, env=SignalGame, turn_order="simultaneous")
    script = Scripted(trainer, signal_policy())
    items = [it for it in signal_game_dataset(8, secrets=("blue", "cat", "red")) if it["secret"] != "red"][:2]
    rollout = trainer.train_rollout_engine.run(items, trainer.generation.generate)
    receiver = rollout.samples_of_agent(1)[0]
    assert "Agent 1:" not in receiver.prompt  # the signal arrives when the turn ends, after the submit
    assert script.calls == [(0, 4), (1, 4)]  # submit ends the game: no answer to its result
    # the submit (of the wrong answer) ended the game before the end of the turn delivered the signal: only the
    # submit term
    assert all(n.rewards.tolist() == [0.25, 0.25] for n in rollout.nodes)


def test_loss_scores_generated_tokens_only_at_the_sampling_temperature(tiny_path, tok, tmp_path):
    """The MAGRPO loss on an agentic rollout equals its formula with TRL's mask (completion_mask * tool_mask) and
    log-probs of logits / temperature; without the mask it would differ (the tool tokens would be trained on)."""
    from trl_marl.models.team import agent_token_logprobs

    trainer = signal_trainer(tiny_path, tok, tmp_path, temperature=0.7, rollout_buffer_size=2)
    Scripted(trainer, signal_policy(counter=[0]))
    items = [trainer.train_dataset[i] for i in range(2)]
    (inputs,) = trainer._rollout_step(items)
    rollout = inputs["rollout"]
    assert torch.cat([n.rewards for n in rollout.nodes]).std() > 0  # right and wrong answers: advantages
    loss = trainer.compute_loss(trainer.model, inputs)
    expected, unmasked = 0.0, 0.0
    for i in range(2):
        samples = rollout.samples_of_agent(i)
        batch = trainer.agent_batch(i, samples)
        logp = agent_token_logprobs(trainer.team.agents[i], batch, 0.7)
        manual = torch.log_softmax(
            trainer.team.agents[i](input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits / 0.7, -1
        )
        C = batch.completion_ids.shape[1]
        gathered = manual[:, -C - 1 : -1].gather(2, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
        valid = torch.zeros_like(batch.completion_mask)
        for r, s in enumerate(samples):
            valid[r, : s.completion_ids.numel()] = 1
        assert torch.allclose(logp[valid.bool()], gathered[valid.bool()], atol=1e-4)  # logits / temperature
        adv = inputs["advantages"][i].reshape(-1)
        expected += -((logp * batch.completion_mask).sum(-1) * adv).mean()
        unmasked += -((logp * valid).sum(-1) * adv).mean()
    assert torch.allclose(loss, expected, atol=1e-4)
    assert not torch.allclose(loss, unmasked, atol=1e-3)


def test_dapo_normalizes_by_generated_tokens_as_trl(tiny_path, tok, tmp_path):
    """loss_type='dapo' on an agentic rollout: TRL's `num_items_in_batch` counts `completion_mask * tool_mask`, so
    each agent's loss is -sum(A * mask) / (its generated tokens); counting the inserted tool-result tokens too would
    shrink it. On-policy (one iteration) each token's ratio is 1, so the loss's value is that weighted mean of -A."""
    trainer = signal_trainer(tiny_path, tok, tmp_path, rollout_buffer_size=2, loss_type="dapo")
    Scripted(trainer, signal_policy(counter=[0]))
    items = [trainer.train_dataset[i] for i in range(2)]
    (inputs,) = trainer._rollout_step(items)
    rollout = inputs["rollout"]
    loss = trainer.compute_loss(trainer.model, inputs)
    expected, with_tool_tokens = 0.0, 0.0
    for i in range(2):
        samples = rollout.samples_of_agent(i)
        mask = trainer.agent_batch(i, samples).completion_mask
        adv = inputs["advantages"][i].reshape(-1, 1)
        inserted = sum(s.completion_ids.numel() for s in samples) - mask.sum()
        expected += -(adv * mask).sum() / mask.sum()
        with_tool_tokens += -(adv * mask).sum() / (mask.sum() + inserted)
    assert sum(int((s.tool_mask == 0).sum()) for s in rollout.samples_of_agent(1) if s.tool_mask is not None) > 0
    assert torch.allclose(loss, expected, atol=1e-5)
    assert not torch.allclose(loss, with_tool_tokens, atol=1e-4)


class WithSamplingLogprobs(Scripted):
    """`Scripted`, reporting a sampling log-prob for every generated token as vLLM does: -0.01 * (its position in
    the generation + 1), so each segment's values are known."""

    def __call__(self, prompts_per_agent, num_generations, greedy=False):
        outs = super().__call__(prompts_per_agent, num_generations, greedy)
        for out in outs:
            out.sampling_logprobs = [
                -0.01 * torch.arange(1, c.numel() + 1, dtype=torch.float32) for c in out.completion_ids
            ]
        return outs


@pytest.mark.parametrize("mode", ["sequence_mask", "token_truncate"])
def test_vllm_importance_sampling_correction_on_an_agentic_team(tiny_path, tok, tmp_path, mode):
    """vLLM's IS correction with tools, as TRL's `_tool_call_loop` does it: each turn keeps the engine's log-probs
    of its generated segments and 0.0 at the inserted tool-result tokens, and the ratio uses `completion_mask *
    tool_mask` (an inserted token, never sampled, would otherwise weigh exp(logp_old - 0) into it). The old code
    refused the combination at construction (and `use_vllm='auto'` fell back to transformers)."""
    from trl_marl.algorithms.grpo import vllm_importance_sampling_ratio

    trainer = signal_trainer(tiny_path, tok, tmp_path, rollout_buffer_size=2, loss_type="grpo")
    # as with use_vllm=True (this test samples through `WithSamplingLogprobs`); set after construction, since with
    # use_vllm=False the config refuses the vLLM settings
    trainer.args.vllm_importance_sampling_mode = mode
    trainer.args.vllm_importance_sampling_clip_min = 0.5 if mode == "token_truncate" else None
    step = trainer.rl_step.grpo_step
    step.vllm_correction = True
    WithSamplingLogprobs(trainer, signal_policy(counter=[0]))
    items = [trainer.train_dataset[i] for i in range(2)]
    rollout = trainer.train_rollout_engine.run(items, trainer.generation.generate)
    receiver = [s for s in rollout.samples_of_agent(1) if s.tool_mask is not None]
    assert receiver and all((s.tool_mask == 0).any() for s in receiver)
    for s in receiver:  # generated segments: their own positions' values; inserted tokens: 0.0
        expected, position = [], 0
        for generated in s.tool_mask.tolist():
            position = position + 1 if generated else 0
            expected.append(-0.01 * position if generated else 0.0)
        torch.testing.assert_close(s.sampling_logprobs, torch.tensor(expected))
    generations = step.prepare(rollout)
    clip_min = 0.5 if mode == "token_truncate" else None
    for i in range(2):
        samples = rollout.samples_of_agent(i)
        gen = generations[i]
        # a sampler that agrees with the trainer up to 1e-3 per generated token (as vLLM's log-probs do)
        for r, s in enumerate(samples):
            k = s.completion_ids.numel()
            generated = torch.ones(k, dtype=torch.bool) if s.tool_mask is None else s.tool_mask.bool()
            s.sampling_logprobs = torch.where(generated, gen.old_logps[r, :k] - 1e-3, 0.0)
        step._vllm_ratio(rollout, i, gen)
        C = gen.old_logps.shape[1]
        sampling = torch.full((len(samples), C), float("nan"))
        valid = torch.zeros(len(samples), C)
        for r, s in enumerate(samples):
            k = s.completion_ids.numel()
            sampling[r, :k], valid[r, :k] = s.sampling_logprobs, 1.0
        mask = trainer.agent_batch(i, samples).completion_mask.float()  # generated tokens; tool results left out
        expected = vllm_importance_sampling_ratio(gen.old_logps, sampling, mask, mode, clip_min, 3.0)
        torch.testing.assert_close(gen.is_ratio, expected)
        assert (gen.is_ratio > 0.5).all()  # close samplers: no sequence masked, no token clipped
        if i == 1:  # the receiver's turns have tool results: counting them would change the ratio
            with_tools = vllm_importance_sampling_ratio(gen.old_logps, sampling, valid, mode, clip_min, 3.0)
            assert not torch.allclose(gen.is_ratio, with_tools)
    # and through the training step: the ratio reaches the loss, which stays finite
    (inputs,) = trainer._rollout_step(items)
    assert all(g.is_ratio is not None for g in inputs["generations"])
    assert torch.isfinite(trainer.compute_loss(trainer.model, inputs))


class Counter:
    """A shared counter. Agent 1 adds through `add`; the reward is the final value, known only at the end."""

    def reset(self, start: int = 0, **item):
        self.value = start
        return [f" The counter is at {start}. Add to it.", None]

    def add(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.value += by
        return str(self.value)

    def tools_for(self, agent_index):
        return ["add"] if agent_index == 0 else []

    def get_reward(self) -> list[float]:
        return [float(self.value), 0.0]  # per agent


def test_multi_turn_tree_forks_the_environment_and_rewards_the_end(tiny_path, tok, tmp_path):
    trainer = MAGRPOTrainer(
        model=tiny_path,
        args=agentic_args(tmp_path, num_turns=2, max_tool_calling_iterations=1, rollout_buffer_size=1),
        train_dataset=[{"prompt": "Count.", "start": 10}] * 2,
        processing_class=tok,
        environment_factory=Counter,
    )
    adds = iter(range(1, 100))

    def policy(agent, text, continued):
        if agent == 1 or continued:
            return "ok" + END
        return CALL.format(name="add", args=f'{{"by": {next(adds)}}}')

    script = Scripted(trainer, policy)
    rollout = trainer.train_rollout_engine.run([{"prompt": "Count.", "start": 10}], trainer.generation.generate)
    root, *children = rollout.nodes
    assert [c.parent for c in children] == [(0, 0), (0, 1)] and [c.turn for c in children] == [1, 1]
    assert root.rewards.tolist() == [0.0, 0.0]  # the episode goes on: no environment reward yet
    # each child branch continues its own counter: 10 + (1 or 2) at turn 1, then + its own add at turn 2
    finals = sorted(v for c in children for v, _ in c.rewards.tolist())
    assert finals == sorted([10 + 1 + 3, 10 + 1 + 4, 10 + 2 + 5, 10 + 2 + 6])
    assert script.calls == [(0, 2), (0, 2), (1, 2), (0, 4), (0, 4), (1, 4)]
    # the per-agent reward adds up along the tree: agent 1's return at the root is its mean final value
    from trl_marl.rollout.returns import rollout_returns

    returns = rollout_returns(rollout)
    assert returns.of_node(0, 0).tolist() == [(14 + 15) / 2, (17 + 18) / 2]
    assert children[0].prompt_history[0] == [root.prompts[0]] and children[0].response_history[1] == ["ok"]


def test_completion_budget_ends_the_turn_as_in_trl(tiny_path, tok, tmp_path):
    trainer = signal_trainer(tiny_path, tok, tmp_path, max_completion_length=80)
    Scripted(trainer, signal_policy())
    rollout = trainer.train_rollout_engine.run([trainer.train_dataset[0]], trainer.generation.generate)
    for s in rollout.samples_of_agent(1):
        assert s.completion_ids.numel() <= 80
        assert s.tool_mask is None  # the call ended the budget before its result: no inserted token, no answer
    assert rollout.metrics["agent_2/tools/calls"] == 1  # it ran (TRL runs it too), its result did not fit


def lookup(city: str) -> str:
    """Look up a city.

    Args:
        city: The city.
    """
    if city == "nowhere":
        raise KeyError("no such city")
    return f"{city}: sunny"


async def slow(seconds: float) -> str:
    """Wait.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return "waited"


def test_standalone_tools_per_agent_failures_and_timeouts(tiny_path, tok, tmp_path):
    from trl_marl.environments import make_tool

    def reward(c1, c2):
        return [float("sunny" in a) for a in c1]

    trainer = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=reward,
        args=agentic_args(
            tmp_path, turn_order="simultaneous", max_tool_calling_iterations=1, max_completion_length=256
        ),
        train_dataset=[{"prompt": "Weather?"}] * 2,
        processing_class=tok,
        tools=[[lookup, make_tool(slow, timeout=0.2)], []],
    )
    plan = iter(["paris", "nowhere"])

    def policy(agent, text, continued):
        if agent == 1:
            assert "Tools:" not in text  # agent 2 has no tools: no schema rendered
            return "hi" + END
        if continued:  # it read the tool results
            return ("It is sunny." if "sunny" in text else "No idea.") + END
        city = next(plan)
        calls = CALL.format(name="lookup", args=f'{{"city": "{city}"}}')
        return calls.replace("<|im_end|>", "") + CALL.format(name="slow", args='{"seconds": 5}')

    Scripted(trainer, policy)
    t0 = time.perf_counter()
    rollout = trainer.train_rollout_engine.run([{"prompt": "Weather?"}], trainer.generation.generate)
    assert time.perf_counter() - t0 < 4  # the async tool was cancelled at its timeout
    m = rollout.metrics
    # per episode: 2 calls each; a timeout in each, and the lookup of "nowhere" raised
    assert m["agent_1/tools/calls"] == 2 and m["agent_1/tools/failures"] == 1.5 and m["agent_1/tools/timeouts"] == 1
    texts = [s.completion for s in rollout.samples_of_agent(0)]
    assert "paris: sunny" in texts[0] and "'error': \"'no such city'\"" in texts[1]  # TRL's error text
    assert rollout.nodes[0].rewards.tolist() == [1.0, 0.0]


class NaNGame(Counter):
    def get_reward(self):
        return float("nan")


class ShortGame(Counter):
    def get_reward(self):
        return [1.0, 2.0, 3.0]


class Other(Counter):
    pass


@pytest.mark.parametrize(
    "kwargs, error, pattern",
    [
        (dict(trainer=MADPOTrainer, tools=[lookup]), ValueError, r"MADPOTrainer does not support tools"),
        (dict(trainer=MARLHFTrainer, env=Counter), ValueError, r"MARLHFTrainer does not support tools"),
        (
            dict(trainer=CentralizedMAGRPOTrainer, turn_order="sequential"),
            ValueError,
            r"CentralizedMAGRPOTrainer does",
        ),
        (dict(trainer=MAReMaxTrainer, remax_baseline="greedy"), ValueError, r"take remax_baseline='greedy'"),
        (dict(joint_mode="cross", tools=[lookup]), ValueError, r"does not take joint_mode='cross'"),
        (dict(external_transition=lambda **k: ["a", "b"]), ValueError, r"does not take external_transition"),
        (dict(early_termination_threshold=0.5), ValueError, r"does not take early_termination_threshold"),
        (dict(env=Counter, reward=False, dataset=None, max_steps=-1), ValueError, r"max_steps must be > 0"),
        (dict(env={"a": Counter, "b": Other}, dataset=None), ValueError, r"dict environment_factory needs a train"),
        (dict(tools=[lookup], reward=False), ValueError, r"no reward source"),
        (dict(tools=[[lookup]]), ValueError, r"a list per agent must have one entry per agent \(2\)"),
        (dict(env=lambda: None), TypeError, r"environment_factory\(\) returned None"),
        (dict(turn_order="round_robin"), ValueError, r"turn_order must be one of \['simultaneous', 'sequential'\]"),
        (dict(max_tool_calling_iterations=-1), ValueError, r"max_tool_calling_iterations must be None"),
    ],
)
def test_bad_arguments_fail_at_construction(tiny_path, tok, tmp_path, kwargs, error, pattern):
    trainer_cls = kwargs.pop("trainer", MAGRPOTrainer)
    env = kwargs.pop("env", None)
    tools = kwargs.pop("tools", None)
    reward = kwargs.pop("reward", True)
    dataset = kwargs.pop("dataset", [{"prompt": "x"}] * 2)
    transition = kwargs.pop("external_transition", None)
    cfg_cls = {MADPOTrainer: MADPOConfig, MARLHFTrainer: MARLHFConfig}.get(trainer_cls, MAGRPOConfig)
    with pytest.raises(error, match=pattern):
        trainer_cls(
            model=tiny_path,
            reward_funcs=(lambda a, b: [0.0] * len(a)) if reward else None,
            args=agentic_args(tmp_path, cls=cfg_cls, **kwargs),
            train_dataset=dataset,
            processing_class=tok,
            tools=tools,
            environment_factory=env,
            external_transition=transition,
        )


@pytest.mark.parametrize(
    "env, item, pattern",
    [
        (NaNGame, {"prompt": "x"}, r"NaNGame.get_reward\(\) returned nan; expected a finite float"),
        (ShortGame, {"prompt": "x"}, r"ShortGame.get_reward\(\) returned 3 values; expected a float or one"),
        ({"c": Counter}, {"prompt": "x", "environment": "d"}, r"environment='d', which is not among .* \['c'\]"),
    ],
)
def test_environment_contract_errors_name_the_method(tiny_path, tok, tmp_path, env, item, pattern):
    trainer = MAGRPOTrainer(
        model=tiny_path,
        args=agentic_args(tmp_path, num_generations=2),
        train_dataset=[{"prompt": "x", "environment": "c"}] * 2,
        processing_class=tok,
        environment_factory=env,
    )
    Scripted(trainer, lambda agent, text, continued: "ok" + END)
    with pytest.raises((ValueError, TypeError), match=pattern):
        trainer.train_rollout_engine.run([item], trainer.generation.generate)


def test_routing_by_environment_column_and_no_dataset(tiny_path, tok, tmp_path):
    """A dict of factories routes by the `environment` column (not passed to reset); an environment that makes
    its own tasks trains without a dataset for `max_steps`."""
    seen = []

    class Tagged(Counter):
        def reset(self, **item):
            seen.append(sorted(item))
            return super().reset(**item)

    trainer = MAGRPOTrainer(
        model=tiny_path,
        args=agentic_args(tmp_path),
        train_dataset=[{"prompt": "x", "environment": "t", "start": 1}, {"prompt": "y", "environment": "c"}],
        processing_class=tok,
        environment_factory={"t": Tagged, "c": Counter},
    )
    Scripted(trainer, lambda agent, text, continued: "ok" + END)
    rollout = trainer.train_rollout_engine.run(list(trainer.train_dataset), trainer.generation.generate)
    assert seen == [["prompt", "start"]]  # the `environment` column is not passed to reset
    assert [n.rewards[0].tolist() for n in rollout.nodes] == [[1.0, 0.0], [0.0, 0.0]]

    class OwnTasks(SignalGame):
        """Draws its own secrets: no dataset."""

        episodes = 0

        def reset(self, **item):
            assert item == {"prompt": ""}  # the placeholder item
            OwnTasks.episodes += 1
            return super().reset(seed=OwnTasks.episodes)

    trainer = MAGRPOTrainer(
        model=tiny_path, args=agentic_args(tmp_path, max_steps=2), processing_class=tok, environment_factory=OwnTasks
    )
    assert len(trainer.train_dataset) == 2 and trainer.train_dataset[0] == {"prompt": ""}
    Scripted(trainer, signal_policy())
    trainer.train()
    assert trainer.state.global_step == 2 and OwnTasks.episodes == 4  # 2 items per step, reset once per item
    assert trainer.state.log_history[0]["rewards/OwnTasks/mean"] == 1.0


def test_actor_critic_team_rolls_out_episodes(tiny_path, tok, tmp_path):
    """MAAC on the signalling game: the critic reads the node's prompts; one training step runs."""
    trainer = MAACTrainer(
        model=tiny_path,
        critic_model=tiny_path,
        args=agentic_args(tmp_path, cls=MAACConfig, num_generations=1, max_completion_length=8),
        train_dataset=signal_game_dataset(4),
        processing_class=tok,
        environment_factory=SignalGame,
    )
    trainer.train()
    logs = trainer.state.log_history[0]
    assert "agent_2/tools/calls" in logs and "rewards/SignalGame/mean" in logs


def test_per_player_rewards_of_a_competitive_game(tiny_path, tok, tmp_path):
    """MAGRPO takes an environment's per-agent reward (competitive games): each agent's advantage is its own."""
    trainer = MAGRPOTrainer(
        model=tiny_path,
        args=agentic_args(tmp_path, rollout_buffer_size=1),
        train_dataset=[{"prompt": "x", "start": 0}] * 2,
        processing_class=tok,
        environment_factory=Counter,
    )
    adds = iter([1, 3])

    def policy(agent, text, continued):
        if agent == 1 or continued:
            return "ok" + END
        return CALL.format(name="add", args=f'{{"by": {next(adds)}}}')

    Scripted(trainer, policy)
    (inputs,) = trainer._rollout_step([{"prompt": "x", "start": 0}])
    assert inputs["rollout"].nodes[0].rewards.tolist() == [[1.0, 0.0], [3.0, 0.0]]
    assert inputs["advantages"][0].tolist() != [[0.0, 0.0]] and inputs["advantages"][1].tolist() == [[0.0, 0.0]]


def test_truncation_reads_the_last_generated_token_of_a_masked_turn():
    """TRL's truncation test (`mask_truncated_completions`) on an agentic row: the last generated token ends it,
    not the token at `mask.sum() - 1` (a tool-result token when the mask has holes). Fails on the old code."""
    from trl_marl.algorithms.grpo import truncated_completions

    eos, pad = 9, 0
    ids = torch.tensor([[5, 6, 7, 7, 8, 9], [5, 6, 7, 7, 8, 4], [5, 9, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 0, 0]])
    assert truncated_completions(ids, mask, eos, pad).tolist() == [False, True, False]


def test_engines_generate_from_token_ids_and_skip_agents_given_none(tiny_path, tok, tmp_path):
    """`PromptText.of_ids`: generation starts from those exact ids (never the text re-tokenized), in the HF engine's
    per-agent and shared-base (one mixed-adapter call) paths; an agent given None takes no part."""
    from peft import LoraConfig

    from trl_marl.data_types.text import PromptText

    ids = tok("Agent 1: The secret is blue.", add_special_tokens=False)["input_ids"]
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    for kwargs in ({}, {"peft_config": lora, "args": agentic_args(tmp_path, share_base_model=True)}):
        trainer = signal_trainer(tiny_path, tok, tmp_path) if not kwargs else MAGRPOTrainer(
            model=tiny_path, train_dataset=signal_game_dataset(4), processing_class=tok,
            environment_factory=SignalGame, **kwargs,
        )  # fmt: skip
        out = trainer.generation.generate([None, [PromptText.of_ids("not these words", ids)]], 2)
        assert out[0].completion_ids == [] and [p.tolist() for p in out[1].prompt_ids] == [ids, ids]


def test_the_agentic_pages_trl_grpo_config_builds_on_this_machine(tmp_path):
    """docs/agentic.md's side-by-side TRL snippet: its `GRPOConfig(...)` constructs here. TRL 1.16 defaults bf16 to
    True, which transformers refuses without a bf16 GPU (old page: "Your setup doesn't support bf16/gpu" on a
    CPU-only machine)."""
    from pathlib import Path

    from trl import GRPOConfig

    page = (Path(__file__).resolve().parents[1] / "docs" / "agentic.md").read_text()
    call = re.search(r"args=(GRPOConfig\([^)]*\))", page).group(1)
    here = call.replace("GRPOConfig(", f"GRPOConfig(output_dir={str(tmp_path)!r}, report_to='none', ", 1)
    args = eval(here, {"GRPOConfig": GRPOConfig})  # the page's arguments, with a scratch output_dir
    assert args.max_tool_calling_iterations == 4
