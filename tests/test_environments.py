"""trl_marl.environments: tools, the team environment contract, turn order, Branch, lock-step play, the built-in game."""

from __future__ import annotations

import asyncio
import math
import random
import threading
import time

import pytest

from trl_marl.environments import (
    EnvironmentRegistry,
    EnvironmentSpec,
    EpisodeConfig,
    SignalGame,
    ToolCallRequest,
    ToolExecutor,
    as_tools,
    check_reset_output,
    check_reward,
    episode_metrics,
    make_tool,
    parse_completion,
    per_agent_tools,
    play,
    prepare_tool_tokenizer,
    render_prompt,
    sees_same_turn,
    signal_game_dataset,
    signal_game_prompts,
    start_branches,
    tool_suffix_ids,
    use_compact_tool_template,
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


def boom(x: str) -> str:
    """Always fails.

    Args:
        x: Anything.
    """
    raise RuntimeError(f"bad {x}")


def whoami(agent_index: int) -> str:
    """Say who called."""
    return f"agent {agent_index}"


# ------------------------------------------------------------------------------------------------------- tools


def test_schema_is_transformers_and_agent_index_is_hidden():
    from transformers.utils import get_json_schema

    assert make_tool(add).schema == get_json_schema(add)
    tool = make_tool(whoami)
    assert tool.takes_agent_index
    assert tool.schema["function"]["parameters"].get("properties", {}) == {}
    assert "agent_index" not in str(tool.schema)


def test_schema_errors_name_the_tool():
    def nodoc(x: int) -> int:
        return x

    with pytest.raises(ValueError, match=r"tool 'nodoc'.*get_json_schema.*docstring"):
        make_tool(nodoc)
    with pytest.raises(TypeError, match="must be a callable"):
        make_tool(3)
    with pytest.raises(ValueError, match=r"share the name\(s\) \['add'\]"):
        as_tools([add, add])


def test_executor_results_failures_as_trl(executor):
    tools = {t.name: t for t in as_tools([add, boom, whoami])}
    reqs = [
        ToolCallRequest(call("add", a=2, b=3), tools, 0, group=0, index=0),
        ToolCallRequest(call("boom", x="y"), tools, 0, group=0, index=1),
        ToolCallRequest(call("nope"), tools, 0, group=0, index=2),
        ToolCallRequest({"type": "code", "name": "add"}, tools, 0, group=0, index=3),
        ToolCallRequest({"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}, tools, 0),
        ToolCallRequest({"type": "function", "function": {"name": "add", "arguments": "{not json"}}, tools, 0, 1),
        ToolCallRequest(call("whoami", agent_index=0), tools, 1, group=2),  # the model cannot impersonate
        ToolCallRequest(call("add", a=1), tools, 0, group=3),  # missing argument: the TypeError goes to the model
    ]
    r = executor.run(reqs)
    assert [x.ok for x in r] == [True, False, False, False, True, False, True, False]
    assert r[0].message() == {"role": "tool", "name": "add", "content": "5"}
    assert r[1].content == str({"error": "bad y"})  # TRL's format
    assert r[2].content == str({"error": "Tool nope not found."})
    assert r[3].content == str({"error": "Unsupported tool call type: code"})
    assert r[4].content == "2"
    assert "not valid JSON" in r[5].error
    assert r[6].content == "agent 1" and r[6].arguments == {"agent_index": 1}
    assert "missing 1 required positional argument" in r[7].error


def test_async_tools_run_concurrently_with_a_bound():
    async def nap(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        await asyncio.sleep(seconds)
        return "rested"

    tools = {"nap": make_tool(nap)}
    reqs = [ToolCallRequest(call("nap", seconds=0.25), tools, 0, group=g) for g in range(8)]
    wide = ToolExecutor(timeout=5, max_concurrency=8)
    start = time.perf_counter()
    out = wide.run(reqs)
    wall = time.perf_counter() - start
    assert all(x.ok and x.content == "rested" for x in out)
    assert wall < 0.25 * 8 / 2, wall  # concurrent: far below the sum of the sleeps (2 s)
    narrow = ToolExecutor(timeout=5, max_concurrency=2)
    start = time.perf_counter()
    narrow.run(reqs[:4])
    assert time.perf_counter() - start >= 2 * 0.25 * 0.9  # at most 2 in flight: two waves
    wide.close(), narrow.close()


def test_calls_of_one_branch_run_in_order_and_results_keep_request_order(executor):
    seen = []

    async def slow(tag: str) -> str:
        """Record a tag after a pause.

        Args:
            tag: The tag.
        """
        await asyncio.sleep(0.05)
        seen.append(tag)
        return tag

    def fast(tag: str) -> str:
        """Record a tag.

        Args:
            tag: The tag.
        """
        seen.append(tag)
        return tag

    tools = {t.name: t for t in as_tools([slow, fast])}
    reqs = [ToolCallRequest(call("fast", tag="b"), tools, 0, group="x", index=1)]
    reqs.append(ToolCallRequest(call("slow", tag="a"), tools, 0, group="x", index=0))
    out = executor.run(reqs)
    assert seen == ["a", "b"]  # index order within the branch, though the fast call came first in the list
    assert [x.content for x in out] == ["b", "a"]  # results in request order


def test_timeouts_stop_async_and_abandon_sync_tools():
    cancelled = threading.Event()
    release = threading.Event()

    async def hang(x: int) -> str:
        """Hang.

        Args:
            x: Anything.
        """
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    def block(x: int) -> str:
        """Block.

        Args:
            x: Anything.
        """
        release.wait(30)
        return "late"

    tools = {t.name: t for t in as_tools([hang, block, add])}
    ex = ToolExecutor(timeout=0.3, max_concurrency=4, max_sync_concurrency=1)
    start = time.perf_counter()
    out = ex.run(
        [
            ToolCallRequest(call("hang", x=1), tools, 0, group=0),
            ToolCallRequest(call("block", x=1), tools, 0, group=1),
            ToolCallRequest(call("add", a=1, b=2), tools, 0, group=2),  # a sync call after the abandoned one
        ]
    )
    wall = time.perf_counter() - start
    release.set()
    assert wall < 2.0, wall
    assert [x.timed_out for x in out] == [True, True, False]
    assert out[0].content == str({"error": "Tool hang timed out after 0.3 s."})
    assert cancelled.wait(2)  # the async tool was stopped
    assert out[2].content == "3"  # the abandoned sync thread did not hold the sync slot
    per_tool = make_tool(add, timeout=0.01)
    assert per_tool.timeout == 0.01
    with pytest.raises(ValueError, match="timeout must be a positive"):
        ToolExecutor(timeout=0)
    with pytest.raises(ValueError, match="max_concurrency must be an int >= 1"):
        ToolExecutor(max_concurrency=0)
    ex.close()


@pytest.fixture
def tool_tokenizer(tiny_tokenizer):
    return use_compact_tool_template(tiny_tokenizer)


def test_prepare_tool_tokenizer(tiny_tokenizer):
    with pytest.raises(ValueError, match="does not support tool calling"):
        prepare_tool_tokenizer(tiny_tokenizer)  # the tiny model's plain ChatML template drops tool calls
    from trl.chat_template_utils import qwen2_5_chat_template, qwen3_template

    tiny_tokenizer.chat_template = qwen2_5_chat_template
    assert prepare_tool_tokenizer(tiny_tokenizer) is None
    assert tiny_tokenizer.response_template == qwen3_template  # set by TRL's add_response_schema
    use_compact_tool_template(tiny_tokenizer)
    assert prepare_tool_tokenizer(tiny_tokenizer) is None  # supported, prefix-preserving


def test_render_and_parse_with_trls_parser(tool_tokenizer):
    tools = as_tools([add])
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    text = render_prompt(tool_tokenizer, messages, tools)
    assert '"name": "add"' in text and text.endswith("<|im_start|>assistant\n")
    assert "Tools" not in render_prompt(tool_tokenizer, messages, [])  # tools=[] renders no tool preamble
    prompt_ids = tool_tokenizer(text, add_special_tokens=False)["input_ids"]

    def ids(s):
        return tool_tokenizer(s, add_special_tokens=False)["input_ids"]

    parsed = parse_completion(
        tool_tokenizer,
        ids('Sure.<tool_call>\n{"name": "add", "arguments": {"a": "2", "b": 3}}\n</tool_call><|im_end|>'),
        prompt_ids,
        tools,
    )
    assert parsed["content"] == "Sure."
    assert parsed["tool_calls"] == [call("add", a=2, b=3)]  # "2" typed as an integer by the schema
    assert parse_completion(tool_tokenizer, ids("It is 5.<|im_end|>"), prompt_ids, tools) == {
        "role": "assistant",
        "content": "It is 5.",
    }
    broken = parse_completion(
        tool_tokenizer, ids('<tool_call>\n{"name": "add", "argu</tool_call><|im_end|>'), prompt_ids, tools
    )
    assert "tool_calls" not in broken and broken["content"].startswith("<tool_call>")  # TRL's plain-text fallback


def test_tool_suffix_ids_is_the_rendered_tool_segment(tool_tokenizer):
    conv = [{"role": "user", "content": "hi"}, msg("", call("add", a=1, b=2))]
    tool_msgs = [{"role": "tool", "name": "add", "content": "3"}]
    suffix = tool_suffix_ids(tool_tokenizer, tool_msgs)
    assert tool_tokenizer.decode(suffix) == "<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"
    before = tool_tokenizer.apply_chat_template(conv, tokenize=True, return_dict=False)
    after = tool_tokenizer.apply_chat_template(
        conv + tool_msgs, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert list(before) + suffix == list(after)  # concatenation equals re-rendering (what TRL relies on)
    with pytest.raises(ValueError, match="tool_messages is empty"):
        tool_suffix_ids(tool_tokenizer, [])


# --------------------------------------------------------------------------------------- environment contract


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


def test_spec_reads_tools_like_trl_plus_reserved_names():
    spec = EnvironmentSpec.probe(None, Counter)
    assert sorted(spec.tools) == ["increment", "read"]  # not reset/get_reward/tools_for/_private
    assert spec.has_reward and spec.has_tools_for and not spec.has_is_done
    env = Counter()
    assert list(spec.tools_for(env, 0)) == ["read"]
    assert sorted(spec.tools_for(env, 1)) == ["increment", "read"]
    assert spec.bind(env)["read"].function.__self__ is env


def test_contract_errors_name_the_method_and_type():
    class NoReset:
        def step(self):
            """Step."""

    with pytest.raises(TypeError, match=r"NoReset .*must define a callable `reset\(\*\*item\)`"):
        EnvironmentSpec.probe(None, NoReset)
    with pytest.raises(TypeError, match=r"environment_factory\(\) returned None"):
        EnvironmentSpec.probe(None, lambda: None)
    with pytest.raises(TypeError, match=r"environment_factory\['x'\] must be callable"):
        EnvironmentRegistry({"x": 3})
    with pytest.raises(TypeError, match="environment_factory must be a callable"):
        EnvironmentRegistry(3)

    class BadTool:
        def reset(self, **item):
            return None

        def act(self, x):
            return x

    with pytest.raises(ValueError, match=r"BadTool.act is a public method, hence a tool, but tool 'act'"):
        EnvironmentSpec.probe(None, BadTool)

    with pytest.raises(TypeError, match=r"X.reset\(\) returned int; expected None, a str, or a list"):
        check_reset_output(3, 2, "X")
    with pytest.raises(
        ValueError, match=r"X.reset\(\) returned a list of 3 entries; expected one str \| None per agent"
    ):
        check_reset_output(["a", "b", "c"], 2, "X")
    with pytest.raises(TypeError, match=r"X.reset\(\) returned a list containing int"):
        check_reset_output(["a", 1], 2, "X")
    assert check_reset_output("hi", 2, "X") == ["hi", "hi"]
    assert check_reset_output(None, 2, "X") == [None, None]

    with pytest.raises(ValueError, match=r"X.get_reward\(\) returned nan; expected a finite float"):
        check_reward(math.nan, 2, "X")
    with pytest.raises(ValueError, match=r"X.get_reward\(\) returned \[1\] = nan"):
        check_reward([1.0, float("nan")], 2, "X")
    with pytest.raises(
        ValueError, match=r"X.get_reward\(\) returned 3 values; expected a float or one float per agent \(2\)"
    ):
        check_reward([1, 2, 3], 2, "X")
    with pytest.raises(TypeError, match=r"X.get_reward\(\) returned str; expected a float"):
        check_reward("1", 2, "X")
    with pytest.raises(TypeError, match=r"X.get_reward\(\) returned bool; expected a float"):
        check_reward(True, 2, "X")
    assert check_reward(0.5, 3, "X") == ([0.5] * 3, True)
    import numpy as np

    assert check_reward(np.array([1.0, 2.0]), 2, "X") == ([1.0, 2.0], False)


def test_routing_by_environment_column():
    class A(Counter):
        pass

    class B(Counter):
        pass

    reg = EnvironmentRegistry({"a": A, "b": B})
    name, kwargs = reg.route({"environment": "b", "start": 3})
    assert name == "b" and kwargs == {"start": 3}  # the column is not passed to reset
    with pytest.raises(ValueError, match=r"environment='c'.*Expected one of: \['a', 'b'\]"):
        reg.route({"environment": "c"})
    with pytest.raises(KeyError, match=r"needs an 'environment' column.*\['a', 'b'\].*columns \['start'\]"):
        reg.route({"start": 1})
    single = EnvironmentRegistry(A)
    assert single.route({"environment": "x", "start": 1}) == (None, {"environment": "x", "start": 1})
    cfg = EpisodeConfig(num_agents=2)
    bs = start_branches(cfg, [{"environment": "b", "start": 7}], lambda it: ["", ""], registry=reg, num_generations=2)
    assert [type(b.env) for b in bs] == [B, B] and bs[0].env is not bs[1].env
    assert bs[0].env.value == 7 and bs[0].prompt(0) == [{"role": "user", "content": " Read it."}]


class Hooks(Counter):
    """Returns wrong types on demand."""

    bad = None

    def is_done(self):
        return "no" if self.bad == "is_done" else False

    def active_agents(self):
        return [5] if self.bad == "active_agents" else [0, 1]

    def observe(self, agent_index):
        return 3 if self.bad == "observe" else None

    def tools_for(self, agent_index):
        return ["fly"] if self.bad == "tools_for" else ("read" if self.bad == "tools_for_type" else ["read"])


@pytest.mark.parametrize(
    "bad, error, pattern",
    [
        ("is_done", TypeError, r"Hooks.is_done\(\) must be a bool, got str"),
        ("active_agents", ValueError, r"Hooks.active_agents\(\) returned 5; expected agent indices in \[0, 2\)"),
        ("observe", TypeError, r"Hooks.observe\(0\) must return a str or None, got int"),
        ("tools_for", ValueError, r"Hooks.tools_for\(0\) returned 'fly', which is not one of its tools"),
        ("tools_for_type", TypeError, r"Hooks.tools_for\(0\) must return a list of tool names"),
    ],
)
def test_hook_errors(bad, error, pattern):
    Hooks.bad = None
    reg = EnvironmentRegistry(Hooks)
    (b,) = start_branches(EpisodeConfig(num_agents=2), [{}], lambda it: ["", ""], registry=reg)
    b.env.bad = bad
    with pytest.raises(error, match=pattern):
        b.can_act(0) and b.begin(0)
        b.tools(0)
        b._check_done()


def test_bad_reset_and_reward_surface_through_the_branch():
    class Bad(Counter):
        def reset(self, **item):
            return 42

    with pytest.raises(TypeError, match=r"Bad.reset\(\) returned int"):
        start_branches(EpisodeConfig(num_agents=2), [{}], lambda it: ["", ""], registry=EnvironmentRegistry(Bad))

    class NaN(Counter):
        async def get_reward(self):  # async get_reward, as TRL allows
            return float("nan")

    (b,) = start_branches(EpisodeConfig(num_agents=2), [{}], lambda it: ["", ""], registry=EnvironmentRegistry(NaN))
    with pytest.raises(ValueError, match=r"NaN.get_reward\(\) returned nan"):
        b.reward()


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


def test_signal_game_through_tokens(tool_tokenizer, tiny_path, executor):
    """The token path a trainer takes: render with tools, generate, parse with TRL's parser, suffix, continue."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    cfg = EpisodeConfig(num_agents=2, turn_order="sequential", max_turns=1, max_tool_calling_iterations=1)
    reg = EnvironmentRegistry(SignalGame)
    bs = start_branches(cfg, [{"prompt": "Play.", "secret": "blue"}] * 2, signal_game_prompts, registry=reg)
    scripted = [
        'Sure.<tool_call>\n{"name": "submit", "arguments": {"answer": "blue"}}\n</tool_call><|im_end|>',
        "ok<|im_end|>",
    ]
    torch.manual_seed(0)

    def gen(agent, prompts, tools):
        texts = [render_prompt(tool_tokenizer, p, ts) for p, ts in zip(prompts, tools)]
        out = []
        for i, text in enumerate(texts):
            prompt_ids = tool_tokenizer(text, add_special_tokens=False)["input_ids"]
            if agent == 0:  # the random tiny model speaks for agent 1
                ids = model.generate(torch.tensor([prompt_ids]), max_new_tokens=4, do_sample=True)[
                    0, len(prompt_ids) :
                ]
            else:
                ids = tool_tokenizer(scripted[i], add_special_tokens=False)["input_ids"]
            ids = ids.tolist() if hasattr(ids, "tolist") else ids
            out.append(parse_completion(tool_tokenizer, ids, prompt_ids, tools[i]))
        return out

    play(bs, gen, executor)
    assert bs[0].reward()[0] >= 0.75 and bs[0].done_reason == "environment"
    assert bs[1].done_reason == "max_turns" and bs[1].reward()[0] <= 0.25
    suffix = tool_suffix_ids(tool_tokenizer, [bs[0].histories[1][-1]])
    assert tool_tokenizer.decode(suffix).startswith("<|im_start|>tool\nSubmitted.")


def test_global_random_state_untouched_by_branches():
    state = random.getstate()
    bs = start_branches(
        EpisodeConfig(num_agents=2), [{"seed": 5}], signal_game_prompts, registry=EnvironmentRegistry(SignalGame)
    )
    play(bs, echo)
    assert random.getstate() == state


def test_package_depends_on_no_trainer_code():
    """trl_marl.environments imports only trl_marl.algorithms from trl_marl (the trainers build on it, not the
    other way round), and importing it loads no trainer module."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "trl_marl" / "environments"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                assert (node.module or "").startswith("algorithms"), f"{path.name} imports ..{node.module}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith("trl_marl") or node.module.startswith("trl_marl.algorithms")
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("trl_marl") for a in node.names)
    code = (
        "import sys, trl_marl.environments as e; e.SignalGame; "
        "bad = [m for m in sys.modules if m.startswith(('trl_marl.trainers', 'trl_marl.rollout', 'trl_marl.team'))]; "
        "print(bad); sys.exit(bool(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


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
