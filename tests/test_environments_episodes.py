"""trl_marl.environments: turn order, Branch (copies, timeouts, early ends), lock-step play, the signalling game."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from trl_marl.environments import (
    EnvironmentRegistry,
    EpisodeConfig,
    SignalGame,
    ToolExecutor,
    episode_metrics,
    per_agent_tools,
    play,
    sees_same_turn,
    signal_game_dataset,
    signal_game_prompts,
    start_branches,
)


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def msg(content="", *calls):
    m = {"role": "assistant", "content": content}
    if calls:
        m["tool_calls"] = list(calls)
    return m


@pytest.fixture(scope="module")
def executor():
    ex = ToolExecutor(timeout=5.0, max_concurrency=16)
    yield ex
    ex.close()


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class Counter:
    """A shared counter; agent 0 may only read it."""

    def __init__(self):
        self.value = 0
        self.lock = None

    def reset(self, start: int = 0, **item) -> list[str | None]:
        self.value = start
        return [" Read it.", None]

    def increment(self, by: int, agent_index: int) -> str:
        """Increment the counter.

        Args:
            by: How much.
        """
        self.value += by
        return f"{self.value} (by agent {agent_index})"

    def read(self) -> int:
        """Read the counter."""
        return self.value

    def tools_for(self, agent_index: int) -> list[str]:
        return ["read"] if agent_index == 0 else ["read", "increment"]

    def get_reward(self) -> float:
        return float(self.value)

    def _private(self):
        return None


# ------------------------------------------------------------------------------------------ turn order, branches


def test_sees_same_turn():
    assert sees_same_turn(2, 3, "sequential") == [0, 1]
    assert sees_same_turn(2, 3, "simultaneous") == []
    with pytest.raises(ValueError, match="turn_order must be one of"):
        sees_same_turn(0, 2, "random")
    with pytest.raises(ValueError, match="EpisodeConfig.turn_order must be one of"):
        EpisodeConfig(num_agents=2, turn_order="round_robin")
    with pytest.raises(ValueError, match="EpisodeConfig.max_turns must be an int >= 1"):
        EpisodeConfig(num_agents=2, max_turns=0)
    with pytest.raises(ValueError, match="agent_names must name every agent"):
        EpisodeConfig(num_agents=2, agent_names=("a",))


def echo(agent, prompts, tools):
    """Each agent says what it saw last, tagged with its index."""
    return [f"A{agent + 1} after [{p[-1]['content'][-30:]}]" for p in prompts]


@pytest.mark.parametrize("order", ["sequential", "simultaneous"])
def test_turn_order_visibility(order):
    cfg = EpisodeConfig(num_agents=3, turn_order=order, max_turns=2)
    (b,) = start_branches(cfg, [{}], lambda it: ["go1", "go2", "go3"])
    counters = play([b], echo)
    assert counters["generate_calls"] == 6  # one per agent position per turn
    first_turn_of_agent3 = [m["content"] for m in b.histories[2][:3]]
    if order == "sequential":
        assert first_turn_of_agent3[0] == "go3"
        assert first_turn_of_agent3[1].startswith("Agent 1: A1") and first_turn_of_agent3[2].startswith("Agent 2: A2")
        assert "go2" in b.transcript[2][2]  # agent 3 answered after seeing agent 2's message (which quoted go2)
    else:
        assert b.histories[2][1]["role"] == "assistant"  # acted before anything from the others arrived
        assert b.transcript[2][2] == "A3 after [go3]"
        assert b.histories[2][2]["content"].startswith("Agent 1: A1")  # delivered at the end of the turn
    assert b.done and b.done_reason == "max_turns" and b.turn == 2


class Lab:
    """Agent 0 looks up values (async) and may stop the episode; agent 1 only talks."""

    def reset(self, **item):
        self.looked, self.done = [], False
        return None

    async def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        await asyncio.sleep(0.01)
        self.looked.append(key)
        return key.upper()

    def stop(self) -> str:
        """End the episode."""
        self.done = True
        return "stopped"

    def tools_for(self, agent_index):
        return ["lookup", "stop"] if agent_index == 0 else []


def test_lockstep_one_generate_per_position_per_tool_round(executor):
    cfg = EpisodeConfig(num_agents=2, max_turns=1, max_tool_calling_iterations=3)
    reg = EnvironmentRegistry(Lab)
    bs = start_branches(cfg, [{}] * 4, lambda it: ["q", "q"], registry=reg)
    plan = {0: 0, 1: 1, 2: 2, 3: 5}  # tool rounds each branch wants (branch 3 wants more than allowed)
    calls = []

    def gen(agent, prompts, tools):
        calls.append((agent, len(prompts)))
        out = []
        for p, _ts in zip(prompts, tools):
            uid = int(p[0]["content"][-1]) if agent == 0 else -1
            done_rounds = sum(m["role"] == "tool" for m in p)
            want = plan.get(uid, 0)
            out.append(msg("", call("lookup", key=f"k{done_rounds}")) if done_rounds < want else msg(f"final {uid}"))
        return out

    for i, b in enumerate(bs):
        b.histories[0][0]["content"] = f"branch {i}"
    counters = play(bs, gen, executor)
    # agent 0: 4 rows, then 3 (branches 1-3), 2 (branches 2-3), 1 (branch 3, capped at 3 rounds); agent 1: 4 rows
    assert calls == [(0, 4), (0, 3), (0, 2), (0, 1), (1, 4)]
    assert counters == {"generate_calls": 5, "rows": 14, "tool_calls": 6}
    assert [b.stats[0].calls for b in bs] == [0, 1, 2, 3]
    assert bs[3].env.looked == ["k0", "k1", "k2"]
    last = [m for m in bs[3].histories[0] if m["role"] == "assistant"][-1]
    assert last["tool_calls"] and bs[3].histories[0][-2] is last  # the 4th round's call was left unexecuted (TRL)
    assert [s.kind for s in bs[2].segments[0]] == ["model", "tool", "model", "tool", "model"]
    m = episode_metrics(bs)
    assert m["agent_1/tools/calls"] == 1.5 and m["agent_2/tools/calls"] == 0 and m["agent_1/episode_length"] == 1


def test_environment_ends_the_episode_early(executor):
    cfg = EpisodeConfig(num_agents=2, max_turns=5)
    reg = EnvironmentRegistry(Lab)
    bs = start_branches(cfg, [{}] * 2, [["stop", "q"], ["q", "q"]], registry=reg)

    def gen(agent, prompts, tools):
        return [
            msg("", call("stop")) if p[0]["content"] == "stop" and p[-1]["role"] != "tool" else msg("hi")
            for p in prompts
        ]

    play(bs, gen, executor)
    assert bs[0].done_reason == "environment" and bs[0].turns_acted == [1, 0]  # agent 2 never acted
    assert bs[1].done_reason == "max_turns" and bs[1].turns_acted == [5, 5]
    assert bs[0].histories[0][-1]["role"] == "tool"  # no generation after the episode ended


def test_tools_per_agent_and_agent_index(executor):
    cfg = EpisodeConfig(num_agents=2, max_turns=1, max_tool_calling_iterations=1)
    (b,) = start_branches(
        cfg,
        [{"start": 10}],
        lambda it: ["", ""],
        registry=EnvironmentRegistry(Counter),
        tools=per_agent_tools([[add], []], 2),
    )
    assert [t.name for t in b.tools(0)] == ["add", "read"]
    assert [t.name for t in b.tools(1)] == ["read", "increment"]  # in tools_for's order

    def gen(agent, prompts, tools):
        return [
            msg("", call("increment", by=2), call("add", a=1, b=1)) if p[-1]["role"] != "tool" else msg("ok")
            for p in prompts
        ]

    play([b], gen, executor)
    assert b.env.value == 12  # only agent 2 may increment; agent 1's call failed
    tool_msgs = [[m["content"] for m in h if m["role"] == "tool"] for h in b.histories]
    assert tool_msgs[0] == [str({"error": "Tool increment not found."}), "2"]
    assert tool_msgs[1] == ["12 (by agent 1)", str({"error": "Tool add not found."})]  # agent_index filled in
    assert [s.failures for s in b.stats] == [1, 1] and b.reward() == [12.0, 12.0] and b.joint_reward
    with pytest.raises(ValueError, match=r"tools: a list per agent must have one entry per agent \(2\), got 3"):
        per_agent_tools([[add], [], []], 2)
    assert [[t.name for t in ts] for ts in per_agent_tools([add], 2)] == [["add"], ["add"]]


class Locked(Counter):
    """Cannot be deep-copied (holds a lock): forking rebuilds and replays."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


class Cloned(Counter):
    clones = 0

    def clone(self):
        Cloned.clones += 1
        c = Cloned()
        c.value = self.value
        return c


@pytest.mark.parametrize("cls", [Counter, Locked, Cloned])
def test_fork_copies_state_independently(cls, executor):
    cfg = EpisodeConfig(num_agents=2, max_turns=3, max_tool_calling_iterations=1)
    (b,) = start_branches(
        cfg, [{"start": 1}], lambda it: ["", ""], registry=EnvironmentRegistry(cls), executor=executor
    )
    b.begin(1)
    reqs = b.add_completion(1, msg("", call("increment", by=4)))
    b.add_tool_results(1, executor.run(reqs))
    b.finish(1)
    kids = b.fork(3)
    assert [k.env.value for k in kids] == [5, 5, 5] and all(k.env is not b.env for k in kids)
    kids[0].env.value = 100
    kids[0].histories[1].append({"role": "user", "content": "x"})
    assert b.env.value == 5 and kids[1].env.value == 5 and len(kids[1].histories[1]) == len(b.histories[1])
    assert len({k.uid for k in kids} | {b.uid}) == 4
    if cls is Cloned:
        assert Cloned.clones == 3

    class Same(Counter):
        def clone(self):
            return self

    (s,) = start_branches(cfg, [{}], lambda it: ["", ""], registry=EnvironmentRegistry(Same))
    with pytest.raises(ValueError, match=r"Same.clone\(\) returned the same instance"):
        s.fork(1)


# ------------------------------------------------------------------------------------------- the built-in game


def test_signal_game_rewards_and_determinism(executor):
    game = SignalGame()
    texts = game.reset(seed=3)
    assert texts[0].startswith(f"The secret is {game.secret}")
    assert SignalGame().reset(seed=3) == texts  # deterministic given the seed
    with pytest.raises(ValueError, match="needs a `secret` or a `seed`"):
        game.reset()
    with pytest.raises(ValueError, match="secret 'zebra' is not one of"):
        game.reset(secret="zebra")
    game.reset(secret="red")
    assert game.get_reward() == 0.0
    game.on_message(0, "It is RED!")
    assert game.get_reward() == 0.25
    game.on_message(1, "red")
    assert game.get_reward() == 0.5  # plain-text answer: half credit
    assert game.submit("[blue]") == "Submitted." and game.done
    assert game.get_reward() == 0.5  # signal + well-formed submit, wrong answer
    game.reset(secret="red")
    game.on_message(0, "red or blue")  # naming every choice is not a signal
    game.submit("red")
    assert game.reward_terms() == {"signal": 0.0, "submit": 1.0, "correct": 1.0, "text": 0.0}
    g2 = SignalGame(per_agent=True)
    g2.reset(secret="cat")
    g2.on_message(0, "cat")
    g2.submit("cat")
    assert g2.get_reward() == [0.75, 0.75]
    with pytest.raises(ValueError, match="unknown weight"):
        SignalGame(weights={"bonus": 1})

    data = signal_game_dataset(30, seed=1)
    assert sorted(set(data["secret"])) == ["blue", "cat", "red"] and data["secret"].count("red") == 10
    cfg = EpisodeConfig(num_agents=2, turn_order="sequential", max_turns=1, max_tool_calling_iterations=1)
    reg = EnvironmentRegistry(SignalGame)
    bs = start_branches(cfg, list(data)[:6], signal_game_prompts, registry=reg, num_generations=2)
    assert [t.name for t in bs[0].tools(0)] == [] and [t.name for t in bs[0].tools(1)] == ["submit"]

    def perfect(agent, prompts, tools):
        if agent == 0:
            return [f"The word is {p[-1]['content'].split('The secret is ')[1].split('.')[0]}." for p in prompts]
        return [msg("", call("submit", answer=p[-1]["content"].split("word is ")[1].rstrip("."))) for p in prompts]

    play(bs, perfect, executor)
    assert [b.reward() for b in bs] == [[1.0, 1.0]] * 12
    assert all(b.done_reason == "environment" for b in bs)


def test_global_random_state_untouched_by_branches():
    state = random.getstate()
    bs = start_branches(
        EpisodeConfig(num_agents=2), [{"seed": 5}], signal_game_prompts, registry=EnvironmentRegistry(SignalGame)
    )
    play(bs, echo)
    assert random.getstate() == state


def test_environment_calls_have_a_timeout():
    release = threading.Event()

    class Slow:
        def reset(self, hang: str = "", **item):
            self.hang = hang
            if hang == "reset":
                release.wait(10)
            return None

        def on_message(self, agent_index, text):
            if self.hang == "on_message":
                release.wait(10)

        async def get_reward(self):
            await asyncio.sleep(10 if self.hang == "get_reward" else 0)
            return 1.0

    cfg = EpisodeConfig(num_agents=2, max_turns=3, environment_timeout=0.2)
    reg = EnvironmentRegistry(Slow)
    with pytest.raises(TimeoutError, match=r"Slow.reset\(\) did not return within 0.2 s"):
        start_branches(cfg, [{"hang": "reset"}], lambda it: ["a", "b"], registry=reg)
    bs = start_branches(cfg, [{"hang": "on_message"}, {"hang": "get_reward"}], lambda it: ["a", "b"], registry=reg)
    start = time.perf_counter()
    play(bs, echo)
    assert bs[0].done_reason == "environment_timeout" and bs[0].turns_acted == [1, 0] and bs[0].environment_timeouts
    assert bs[1].done_reason == "max_turns" and bs[0].reward() == [1.0, 1.0]
    with pytest.raises(TimeoutError, match=r"Slow.get_reward\(\) did not return within 0.2 s"):
        bs[1].reward()  # an async get_reward is cancelled
    assert time.perf_counter() - start < 3
    assert episode_metrics(bs[:1])["episodes/environment_timeouts"] == 1
    release.set()
    with pytest.raises(ValueError, match="environment_timeout must be a positive number or None"):
        EpisodeConfig(num_agents=2, environment_timeout=0)
