"""One turn of an agentic rollout, at the level of tokens: every agent position generates for all live branches at
once, tools run between generations, tool results are inserted as masked tokens.

For each agent position k of the turn (`trl_marl.environments.lockstep`'s loop, in tokens):

1. the branches where agent k acts begin its turn (`begin_position`: the environment's `active_agents` and
   `observe`);
2. each branch's conversation for agent k is rendered with its tools' schemas by agent k's chat template
   (`render_prompt`, as TRL renders `apply_chat_template(tools=...)`);
3. ONE `generate` call for agent k over all those branches; each completion is parsed with TRL's
   `parse_response` (`parse_completion`); the tool calls of every branch run in ONE executor call
   (`run_tool_round`);
4. a branch that called a tool continues from its exact tokens, `prompt + completion + tool-result tokens`
   (`tool_suffix_ids`, never re-tokenized, as TRL's `_tool_call_loop`), the tool-result tokens masked out of the
   loss; back to 3 with the branches that continue, up to `max_tool_calling_iterations` rounds.

The completion budget is TRL's: `max_completion_length` counts every token of the agent's turn, generated or
inserted; a tool result that would not leave room for one more token ends the turn instead, and a generation is cut
to what is left. A completion cut by the budget (no EOS) ends the agent's turn: its tool calls are not run. With
`synced` (ZeRO-3 / FSDP2: generating is a collective) every process makes the same number of `generate` calls for
each position (`any_over_processes`), a process with no branch left calling with no prompts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl_marl.data_types.rollout import GenerationOutput
from trl_marl.data_types.text import PromptText
from trl_marl.distributed.collective import any_over_processes
from trl_marl.environments import Branch, begin_position, parse_completion, render_prompt, run_tool_round
from trl_marl.environments.tools import Tool, ToolExecutor, tool_suffix_ids

__all__ = ["AgentTurn", "TurnPlayer"]

# generate_fn(prompts_per_agent, num_generations) -> one GenerationOutput per agent (None: the agent takes no part)
GenerateFn = Callable[..., list[GenerationOutput]]


@dataclass
class AgentTurn:
    """What one agent did in one branch during one turn, in tokens.

    `prompt` / `prompt_ids`: the rendered conversation it first generated from; `completion_ids`: every token of its
    turn after the prompt (its generations and the tool results between them); `tool_mask`: 1 per generated token,
    0 per inserted one; `sampling_logprobs`: per token, the engine's log-prob of a generated token and 0.0 for an
    inserted one (as TRL's `_tool_call_loop` joins them; the inserted ones are masked), None when a generation came
    without them (the transformers engine); `message`: its message of the turn (what the others and `on_message`
    receive)."""

    prompt: PromptText
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    sampling_logprobs: list[float] | None = field(default_factory=list)
    message: str = ""

    def extend(self, ids: Sequence[int], generated: bool, logprobs: Sequence[float] | None = None) -> None:
        """Append `ids`: generated (with the engine's `logprobs` of them, when it gave them) or inserted."""
        self.completion_ids += list(ids)
        self.tool_mask += [int(generated)] * len(ids)
        if self.sampling_logprobs is None or (generated and logprobs is None):
            self.sampling_logprobs = None
        elif generated:  # NaN where the engine gave fewer than the tokens (no correction there, as TRL's NaN rule)
            given = [float(x) for x in logprobs[: len(ids)]]
            self.sampling_logprobs += given + [math.nan] * (len(ids) - len(given))
        else:
            self.sampling_logprobs += [0.0] * len(ids)

    @property
    def input_ids(self) -> list[int]:
        """Where the next generation of this turn starts: the prompt and everything after it so far."""
        return self.prompt_ids + self.completion_ids


class TurnPlayer:
    """Plays one turn of many branches in lock-step (see the module docstring).

    Args:
        tokenizers: one per agent.
        chat_templates: per agent, the template to render with (None: the tokenizer's own; TRL's
            `get_training_chat_template` where the agent's is not prefix-preserving, `prepare_tool_tokenizer`).
        tool_ready: per agent, whether its tokenizer can render and parse tool calls (`prepare_tool_tokenizer`
            succeeded); an agent that is not is an error only when a branch offers it a tool.
        eos_ids: per agent, the token ids that end a completion.
        executor: runs the tool calls.
        max_completion_length: the token budget of one agent's turn (generated and inserted tokens).
        synced: keep the processes' `generate` calls in step (collective generation).

    `generate_calls` and `rows` count the `generate` calls and the prompts generated (benchmarks, tests).
    """

    def __init__(
        self,
        tokenizers: Sequence[Any],
        chat_templates: Sequence[str | None],
        tool_ready: Sequence[bool],
        eos_ids: Sequence[Sequence[int]],
        executor: ToolExecutor,
        max_completion_length: int,
        synced: bool = False,
    ):
        self.tokenizers = list(tokenizers)
        self.chat_templates = list(chat_templates)
        self.tool_ready = list(tool_ready)
        self.eos_ids = [set(e) for e in eos_ids]
        self.executor = executor
        self.max_completion_length = max_completion_length
        self.synced = synced
        self.generate_calls = 0
        self.rows = 0

    @property
    def num_agents(self) -> int:
        return len(self.tokenizers)

    def render(self, agent: int, branch: Branch, tools: Sequence[Tool] | None = None) -> PromptText:
        """Agent `agent`'s conversation in `branch`, rendered with its tools' schemas by its chat template."""
        tools = branch.tools(agent) if tools is None else tools
        if tools and not self.tool_ready[agent]:
            raise ValueError(
                f"agent {agent + 1} is offered the tools {[t.name for t in tools]} but its chat template does not "
                "support tool calling (TRL's supports_tool_calling); give it a tool-capable template, e.g. "
                "trl_marl.environments.use_compact_tool_template(tokenizer), passed as processing_class"
            )
        messages = branch.prompt(agent) or [{"role": "user", "content": ""}]  # nothing yet (a game's first state)
        text = PromptText(render_prompt(self.tokenizers[agent], messages, tools, self.chat_templates[agent]))
        text.chat = True
        return text

    def play(self, branches: Sequence[Branch], generate_fn: GenerateFn) -> dict[tuple[int, int], AgentTurn]:
        """Play the current turn of every live branch; returns `{(branch.uid, agent): AgentTurn}` for every agent
        that acted. The branches' turns are closed (`Branch.end_turn`)."""
        live = [b for b in branches if not b.done]
        turns: dict[tuple[int, int], AgentTurn] = {}
        for agent in range(self.num_agents):
            acted = begin_position(live, agent)
            self._position(acted, agent, generate_fn, turns)
            for b in acted:
                turns[(b.uid, agent)].message = b.finish(agent)
        for b in live:
            b.end_turn()
        return turns

    def _position(
        self, batch: list[Branch], agent: int, generate_fn: GenerateFn, turns: dict[tuple[int, int], AgentTurn]
    ) -> None:
        """Agent `agent`'s generations and tool rounds in the branches of `batch`."""
        tok = self.tokenizers[agent]
        tools = [b.tools(agent) for b in batch]
        prompts = [self.render(agent, b, ts) for b, ts in zip(batch, tools)]
        while any_over_processes(bool(batch)) if self.synced else batch:
            out = self._generate(generate_fn, agent, prompts)
            messages = []
            for r, (b, ts) in enumerate(zip(batch, tools)):
                turn = turns.get((b.uid, agent))
                if turn is None:
                    turn = turns[(b.uid, agent)] = AgentTurn(prompts[r], out.prompt_ids[r].tolist())
                prefix = turn.input_ids
                ids = out.completion_ids[r].tolist()[: self.max_completion_length - len(turn.completion_ids)]
                turn.extend(ids, True, None if out.sampling_logprobs is None else out.sampling_logprobs[r].tolist())
                finished = bool(ids) and ids[-1] in self.eos_ids[agent]
                if ts and finished:
                    messages.append(parse_completion(tok, ids, prefix, ts))
                else:  # no tools here, or cut by the budget: plain text, no call is run
                    messages.append({"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)})
            again, tool_messages = run_tool_round(batch, agent, messages, self.executor)
            batch, prompts = [], []
            for b, msgs in zip(again, tool_messages):
                turn = turns[(b.uid, agent)]
                suffix = tool_suffix_ids(tok, msgs, self.chat_templates[agent])
                if len(turn.completion_ids) + len(suffix) >= self.max_completion_length:
                    continue  # no room left to answer the tool result: the turn ends here (TRL drops it too)
                turn.extend(suffix, generated=False)
                batch.append(b)
                prompts.append(PromptText.of_ids(tok.decode(turn.input_ids), turn.input_ids))
            tools = [b.tools(agent) for b in batch]

    def _generate(self, generate_fn: GenerateFn, agent: int, prompts: list[PromptText]) -> GenerationOutput:
        """ONE call for agent `agent` (the other agents take no part), one sample per prompt."""
        request: list[list[PromptText] | None] = [None] * self.num_agents
        request[agent] = prompts
        out = generate_fn(request, 1)[agent]
        if len(out.completion_ids) != len(prompts):
            raise RuntimeError(
                f"generation for agent {agent + 1} returned {len(out.completion_ids)} rows, expected {len(prompts)}"
            )
        self.generate_calls += 1
        self.rows += len(prompts)
        return out
