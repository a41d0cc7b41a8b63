"""`use_vllm=True, vllm_mode="server"`: the team samples through `trl-marl vllm-serve` servers (no vLLM here).

Servers (TRL's fields):

- **one for the team**: `vllm_server_base_url` (one URL), else `http://{vllm_server_host}:{vllm_server_port}`; it
  serves every agent, in the team's order (one engine per agent, or one multi-LoRA engine for a LoRA team);
- **one per agent**: `vllm_server_base_url` a list of one URL per agent, each server serving one agent (agents on
  different servers sample at the same time, one thread per server).

A server's layout (`GET /info`) decides what is pushed (`VLLMServerClient.push_model`): every weight of the agent, a
PEFT agent's adapter merged (`per_agent`), or only its LoRA adapter (`multi_lora`). Pushes are lazy, as colocated
engines sync: before a sampling call, every agent is pushed when the trainer's `global_step` moved since the last
push; otherwise one `GET /info` per server checks that it still holds what was pushed (same step, a version no older:
a restarted server reports version 0) and pushes again where it does not. With several processes the server gets one
push per agent and step, from the main process, which broadcasts the server's answer or its failure (every process
fails together): under DDP at the start of each training rollout (`before_rollout`, where the processes are in step;
the main process decides which agents moved, the others wait for its answer, and sample on their own afterwards);
under ZeRO-3 / FSDP2, where every sampling call is in step, the decision is agreed first and every process joins the
gathers. A process that finds its server restarted, or samples outside a training rollout before any push (an
evaluation at the start), pushes on its own.

A server that does not answer: every request has the deadline `vllm_server_timeout` and is retried twice with
exponential backoff (1 s, 2 s); then `VLLMServerError` (a `GenerationUnavailable`) names the server and the agent, and
the trainer saves a checkpoint at the step boundary before passing it on (`trl_marl.trainers.checkpoints`).
Retrying is safe: a request samples from its own seeds (`vllm_sampling`), and a push replaces the same weights.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from trl_marl.generation.vllm_client import VLLMServerClient, VLLMServerError
from trl_marl.generation.vllm_sampling import SampledRow, VLLMSampling
from trl_marl.models.adapters import causal_lm

if TYPE_CHECKING:
    from trl_marl.generation.hf import HFGeneration

__all__ = ["VLLMServerGeneration", "server_urls"]

# The sampling settings a `/generate` request carries (`vllm_protocol.GenerateRequest`)
_REQUEST_SETTINGS = frozenset({"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens"})


def server_urls(args: Any) -> list[str]:
    """The servers of a config: `vllm_server_base_url` (one URL, or a list of one per agent), else
    `http://{vllm_server_host}:{vllm_server_port}`."""
    urls = args.vllm_server_base_url
    if urls is None:
        return [f"http://{args.vllm_server_host}:{args.vllm_server_port}"]
    return [urls] if isinstance(urls, str) else list(urls)


class VLLMServerGeneration(VLLMSampling):
    """Samples the team's agents through `trl-marl vllm-serve` (see the module docstring); other models (a
    comparator's) sample with the transformers engine it wraps.

    Args:
        transformers_engine: the trainer's `HFGeneration`.
        args: the trainer config (`vllm_server_*`, sampling settings, `logging_*`).
        policy_version: returns the trainer's `global_step`; the agents are pushed again when it moved.
        record_metric: `record_metric(name, value)` adds a training metric (the log-prob gap).
        max_retries, backoff_base: the clients' retries of a failed request and the first retry's delay (seconds).

    Attributes (for benchmarks): `startup_seconds` (waiting for the servers), `sync_seconds` / `num_syncs` (pushes),
    `generate_seconds` (sampling requests), `gap_seconds` (the trainer-side scoring of the log-prob gap metric).
    """

    def __init__(
        self,
        transformers_engine: HFGeneration,
        args: Any,
        policy_version: Callable[[], int],
        record_metric: Callable[[str, float], None],
        *,
        max_retries: int = 2,
        backoff_base: float = 1.0,
    ):
        from trl.distributed import DistributedBackend

        super().__init__(transformers_engine, args, policy_version, record_metric)
        self._dist = DistributedBackend(self.accelerator)
        urls, timeout = server_urls(args), float(args.vllm_server_timeout)
        per_agent = len(urls) > 1
        self.clients = [
            VLLMServerClient(
                url,
                timeout=timeout,
                max_retries=max_retries,
                backoff_base=backoff_base,
                agent_offset=k if per_agent else 0,
                wait=False,
            )
            for k, url in enumerate(urls)
        ]
        # the version and step a server answered for this engine's last push of each agent; None: never pushed
        self._pushed: list[tuple[int, int] | None] = [None] * self.num_agents
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        for client in self.clients:  # one budget for all servers: they load at the same time
            client.wait_until_ready(max(1.0, deadline - time.monotonic()))
        self.startup_seconds = time.perf_counter() - t0
        self._check_servers()

    def _client(self, agent: int) -> VLLMServerClient:
        return self.clients[agent if len(self.clients) > 1 else 0]

    def _served(self, agent: int, info: dict[str, Any]) -> dict[str, Any]:
        """What a server's `/info` says of team agent `agent`."""
        return info["agents"][agent - self._client(agent).agent_offset]

    def _check_servers(self) -> None:
        """Refuse servers that do not serve this team, and sampling settings a request cannot carry, naming the
        server, the agent and the fix."""
        n, agents = self.num_agents, self.team.agents
        for i in range(n):
            extra = set(self.transformers.agent_settings(i).generation_kwargs or {}) - _REQUEST_SETTINGS
            if extra:
                raise ValueError(
                    f"generation_kwargs of agent {i + 1} sets {sorted(extra)}, which vllm_mode='server' does not send "
                    f"(a request carries {sorted(_REQUEST_SETTINGS)}): use vllm_mode='colocate' for them"
                )
        if len(self.clients) > 1 and len(self.clients) != n:
            raise ValueError(
                f"vllm_server_base_url lists {len(self.clients)} servers: give one, or one per agent ({n})"
            )
        for client in self.clients:
            served, wanted = client.info["num_agents"], 1 if len(self.clients) > 1 else n
            if served != wanted:
                what = "one server per agent" if wanted == 1 else "one server for the team"
                raise ValueError(
                    f"vLLM server {client.base_url} serves {served} agent(s); {what} must serve {wanted}: start it "
                    f"with `trl-marl vllm-serve --num_agents {wanted}`"
                )
        for i, agent in enumerate(agents):
            client = self._client(i)
            entry = self._served(i, client.info)
            vocab = causal_lm(agent).config.vocab_size
            if entry["vocab_size"] != vocab:
                raise ValueError(
                    f"vLLM server {client.base_url} (agent {i + 1}) serves {entry['model']} with vocab_size "
                    f"{entry['vocab_size']}; agent {i + 1}'s model has {vocab}: start the server with the agent's model"
                )
            if entry["max_model_len"] <= self.args.max_completion_length:
                raise ValueError(
                    f"vLLM server {client.base_url} (agent {i + 1}) has max_model_len {entry['max_model_len']}, which "
                    f"must exceed max_completion_length ({self.args.max_completion_length}): start it with a larger "
                    "--max_model_len"
                )
            if client.info["layout"] == "multi_lora" and not _has_adapter(agent):
                raise ValueError(
                    f"vLLM server {client.base_url} serves a multi-LoRA team (--enable_lora) and agent {i + 1} has no "
                    "LoRA adapter: train with peft_config, or start the server without --enable_lora"
                )

    # ------------------------------------------------------------------ weights
    def _stale(self, step: int) -> list[bool]:
        """Which agents a server does not hold at `step`: all of them when the step moved since the last push, else
        those whose server no longer reports what was pushed (one `GET /info` per server)."""
        if any(p is None or p[1] != step for p in self._pushed):
            return [True] * self.num_agents
        infos = [client.server_info() for client in self.clients]
        stale = []
        for i, (version, pushed_step) in enumerate(self._pushed):
            entry = self._served(i, infos[self.clients.index(self._client(i))])
            stale.append(not (entry["step"] == pushed_step and entry["version"] >= version))
        return stale

    def before_rollout(self) -> None:
        """Under DDP with several processes (called on every process, in step): the agents whose step moved since
        the main process last pushed them are pushed by the main process alone; the others record its answers, so
        their sampling finds the weights current. One push per agent and step instead of one per process (each a
        copy of the same weights for the server to load). One process, ZeRO-3 / FSDP2: nothing here (`generate`)."""
        if self.accelerator.num_processes == 1 or self.collective:
            return
        from accelerate.utils import broadcast_object_list

        step = self._policy_version()
        # the main process decides: the others' records can differ (a push of their own, after a server restart)
        moved = [i for i, p in enumerate(self._pushed) if p is None or p[1] != step]
        moved = broadcast_object_list([moved if self.accelerator.is_main_process else None], from_process=0)[0]
        self._push_all(moved, step)

    def _ensure_current(self) -> None:
        step = self._policy_version()
        stale = self._stale(step)
        if self.collective:  # the pushes gather sharded weights: every process pushes the same agents
            flags = torch.tensor([float(s) for s in stale], device=self.accelerator.device)
            stale = [bool(f > 0) for f in self.accelerator.reduce(flags, reduction="sum").tolist()]
        self._push_all([i for i, s in enumerate(stale) if s], step, agreed=self.collective)

    def _push_all(self, agents: list[int], step: int, agreed: bool = True) -> None:
        """Push `agents` (`agreed`: every process calls this with the same agents, and the main process sends)."""
        if not agents:
            return
        t0 = time.perf_counter()
        for i in agents:
            self._pushed[i] = (self._push(i, self.team.agents[i], step, agreed), step)
        self.sync_seconds += time.perf_counter() - t0
        self.num_syncs += 1

    def _push(self, i: int, agent: Any, step: int, agreed: bool) -> int:
        """Push agent `i`; returns the version the server answered. `agreed` (every process pushes the same agent
        here): the main process alone sends, the others join the gathers of a sharded agent (ZeRO-3 / FSDP2) or
        wait; its answer (or its failure) is broadcast, so no process samples before the weights landed, and all
        processes fail together."""
        client = self._client(i)
        if not agreed or self.accelerator.num_processes == 1:
            return int(client.push_model(i, agent, step=step, dist=self._dist)["version"])
        from accelerate.utils import broadcast_object_list

        outcome: dict[str, Any] = {}
        failure: Exception | None = None
        if self.accelerator.is_main_process:
            try:
                outcome["version"] = int(client.push_model(i, agent, step=step, dist=self._dist)["version"])
            except Exception as exc:  # the others learn of it below; this process raises the original
                failure = exc
                outcome.update(
                    error=str(exc), server=isinstance(exc, VLLMServerError), status=getattr(exc, "status", None)
                )
        elif self.collective:
            client.gather_model(i, agent, dist=self._dist)
        outcome = broadcast_object_list([outcome], from_process=0)[0]
        if failure is not None:
            raise failure
        if "error" in outcome:
            message = f"the main process's push failed: {outcome['error']}"
            if outcome["server"]:
                raise VLLMServerError(message, url=client.base_url, agent=i, status=outcome["status"])
            raise RuntimeError(message)
        return outcome["version"]

    # ------------------------------------------------------------------ generation
    def _sample(
        self,
        prompt_ids: list[list[list[int]]],
        n: int,
        greedy: bool,
        logprobs: bool,
        seeds: list[int | None],
    ) -> list[list[SampledRow]]:
        def one(i: int) -> list[SampledRow]:
            if not prompt_ids[i]:
                return []
            settings = self.sampling_settings(i, greedy)
            out = self._client(i).generate(
                i,
                prompt_ids[i],
                n=n,
                stop_token_ids=self.eos_ids[i],
                seed=seeds[i],
                logprobs=logprobs,
                **settings,
            )
            lps = out.logprobs or [None] * len(out.completion_ids)
            return list(zip(out.completion_ids, lps))

        agents = range(len(prompt_ids))
        if len(self.clients) == 1:  # one server: its engines take turns anyway
            return [one(i) for i in agents]
        with ThreadPoolExecutor(max_workers=len(self.clients), thread_name_prefix="vllm-server") as pool:
            return list(pool.map(one, agents))

    def close(self) -> None:
        """Close the connections (the servers keep running)."""
        for client in self.clients:
            client.close()


def _has_adapter(agent: Any) -> bool:
    return hasattr(agent, "adapter") or hasattr(agent, "peft_config")
