"""trl_marl.environments: tools (schemas, TRL's parser, the executor), the team environment contract and its errors,
the token path of the built-in game, the package boundary. Turn order and branches: test_environments_episodes.py."""

from __future__ import annotations

import asyncio
import math
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
    make_tool,
    parse_completion,
    play,
    prepare_tool_tokenizer,
    render_prompt,
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


def test_importing_the_package_loads_no_trainer_module():
    """The trainers build on trl_marl.environments, not the other way round (the import direction of every module is
    checked by tests/test_architecture.py); importing it loads no trainer or rollout module."""
    import subprocess
    import sys

    code = (
        "import sys, trl_marl.environments as e; e.SignalGame; "
        "bad = [m for m in sys.modules if m.startswith(('trl_marl.trainers', 'trl_marl.rollout'))]; "
        "print(bad); sys.exit(bool(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
