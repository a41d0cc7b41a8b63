"""`ActorCriticStep`: the RL step of the actor-critic trainers (MAAC, IAC, MAPPO), and of MARLHF with the `maac` /
`iac` backends.

The value stream of a critic turns a rollout into transitions (one per joint action: reward `r_t` minus the
reference-KL penalty, successor `h_{t+1}` on the same trajectory), evaluates the critic on them once (no grad), and
computes targets and advantages that stay FROZEN for the whole update:

    delta_t = r_t + gamma * V(h_{t+1}) - V(h_t)        (no bootstrap on the last collected turn)

Advantages are z-scored inside each (agent, turn) group when `advantage_normalization` is on. The team module
(`ActorCriticTeam`) holds agents, critics and value heads, so one engine and one optimizer (a parameter group per
agent and per critic) cover them, and one `forward` call per training step returns log-probs and values. The
variants (`MAACStep`, `IACStep`, `MAPPOStep`, beside their trainers) set which critics exist and what they read, the
advantage estimator, the actor loss and the update's minibatches.

The step reads its options from the trainer's config: an `ActorCriticConfig`, or a `MARLHFConfig` (which holds the
`maac` / `iac` fields and their `num_critics` / `uses_separate_critics`; `advantage_normalization=None` means on).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from trl.models.utils import unwrap_model_for_generation
from trl.trainer.utils import disable_dropout_in_model

from trl_marl.algorithms.advantages import RunningMeanStd, normalize_in_groups, popart_rescale, td_targets
from trl_marl.algorithms.logprobs import sequence_logprobs
from trl_marl.algorithms.losses import policy_gradient_loss, value_loss
from trl_marl.checkpointing.state_files import CorruptedStateError, read_json_state
from trl_marl.data_types.batches import AgentBatch, CriticBatch, collate_critic_batch
from trl_marl.data_types.critic import CriticData, Transitions, ValueStream, build_transitions
from trl_marl.data_types.rollout import Rollout
from trl_marl.data_types.text import valid_text
from trl_marl.models.loading import check_model_source
from trl_marl.models.value_head import (
    VALUE_HEAD_WEIGHTS,
    ActorCriticTeam,
    ValueHead,
    check_critic_tokenizer,
    hidden_size_of,
    load_critics,
    load_value_head,
    save_value_head,
)
from trl_marl.rollout.returns import RolloutReturns
from trl_marl.trainers.actor_critic.config import ActorCriticConfig
from trl_marl.trainers.actor_critic.critics import AGENT_COPY, NORMALIZER_FILE, joint_critic_text, split_model_config
from trl_marl.trainers.base import MultiAgentTrainer
from trl_marl.trainers.building import agent_learning_rate, decay_groups
from trl_marl.trainers.checkpoints import load_weights
from trl_marl.trainers.data import Experience
from trl_marl.trainers.rl_step import RLStep

__all__ = ["ActorCriticStep"]


class ActorCriticStep(RLStep):
    """Critics inside the team, frozen TD targets, (agent, turn) groups (see the module docstring).

    Args:
        trainer: the trainer that holds the step (built before `MultiAgentTrainer.__init__`).
        args: the trainer's config (the trainer has none yet).
        critic_model: the critic source broadcast to every critic (see `ActorCriticTrainer`).
        critics: a list of critic sources, one per critic.

    Attributes:
        streams: one `ValueStream` per critic (or value head): which agents it serves and where its values are.
        normalizers: each critic's running mean / std of its targets under value normalization (MAPPO), else None.
    """

    resume_types = (CriticData, Transitions, ValueStream, CriticBatch)
    supports_per_agent_rewards = True
    supports_shared_base = False  # critics and value heads need a model per agent
    joint_critic = True  # the critics read the joint text (MAAC, MAPPO) rather than each agent's tokens (IAC)
    critic_loss_per_agent_batch = False  # MAAC: the shared critic is updated with each agent's batch in turn
    needs_old_logprobs = False  # PPO ratios

    def __init__(
        self, trainer: MultiAgentTrainer, args: Any, critic_model: Any = None, critics: Sequence[Any] | None = None
    ):
        super().__init__(trainer)
        if critic_model is not None and critics is not None:
            raise ValueError("pass either critic_model (broadcast to every critic) or critics (a list), not both")
        if critics is not None and not isinstance(critics, (list, tuple)):
            raise TypeError(f"critics must be a list of critic sources, got {type(critics).__name__}")
        self.critic_sources = self._resolve_critic_sources(
            args, critic_model, None if critics is None else list(critics)
        )
        # the argument each source came from, for the messages of `build_team`'s checks
        self.critic_arguments = [
            "critic_model" if critics is None else f"critics[{k}]" for k in range(len(self.critic_sources or []))
        ]
        self.critic_loading: dict = {}  # the critics' from_pretrained keywords (`loading_config`)
        self.streams: list[ValueStream] = []
        self.critic_names: list[str] = []
        self.normalizers: list[RunningMeanStd] | None = None
        self.critic_window: list[tuple] = []  # this optimizer step's critic inputs (sequential MAAC updates)

    @property
    def args(self) -> Any:
        return self.trainer.args

    @property
    def team(self) -> ActorCriticTeam:
        return self.trainer.team

    @property
    def normalize_advantages(self) -> bool:
        """`advantage_normalization`, on when unset (MARLHF's config leaves it None for its backends)."""
        return self.args.advantage_normalization is not False

    def attach(self) -> None:
        t = self.trainer
        if self.args.parallel_training == "mp":  # the Trainer may have moved the team: put critics / heads back
            team = self.team
            for k, critic in enumerate(team.critics):
                critic.to(self.critic_device(k))
            if team.value_heads is not None:
                for i, head in enumerate(team.value_heads):
                    head.to(t.agent_device(i))
        if self.extra_critic_updates_per_step():
            t.add_callback(_SequentialCriticCallback(self))

    # ------------------------------------------------------------------ hooks
    def loading_config(self, model_config: Any, args: ActorCriticConfig) -> Any:
        """The agents' loading options; the critics' (`critic_value_head_hidden_dim`, `critic_model_kwargs`, and
        the shared ones) are kept for `build_team` (`split_model_config`)."""
        agents, self.critic_loading = split_model_config(model_config, args)
        return agents

    def _resolve_critic_sources(self, args, critic_model: Any, critics: list | None) -> list | None:
        """One critic source per value stream (validated, nothing loaded), or None for value heads."""
        if critic_model is None and critics is None:
            raise ValueError(
                f"{type(self.trainer).__name__} needs a critic: pass critic_model (a model id / path or a model "
                "object) or critics=[...]"
            )
        count = args.num_critics
        if critics is not None:
            if len(critics) != count:
                raise ValueError(self._critics_length_message(args, len(critics)))
            return critics
        return [critic_model] * count

    def _critics_length_message(self, args, got: int) -> str:
        return f"critics has {got} entries but {type(self.trainer).__name__} trains {args.num_critics} critic(s)"

    def _advantages(self, trans: Transitions, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One-step TD: `(delta, target)` with `target = r_t + gamma * V(h_{t+1})` (or `r_t` on the last turn)."""
        next_values = values[trans.next_index.clamp(min=0)] if len(trans) else values
        targets = td_targets(trans.rewards, next_values, trans.has_next, self.args.discount)
        return targets - values, targets

    def _value_clip_range(self, stream: ValueStream) -> float | None:
        return None

    def _actor_loss(
        self, i: int, logp: torch.Tensor, batch: AgentBatch, adv: torch.Tensor, data: CriticData, rows: list[int]
    ) -> torch.Tensor:
        """`- mean_j( logprob_sum(a_j) * A_j )`: no importance ratio, no clipping."""
        seq = sequence_logprobs(logp, batch.completion_mask.to(logp.device))
        self.trainer._metrics["train"][f"agent_{i + 1}/logprob_mean"].append(seq.detach().mean().item())
        return policy_gradient_loss(seq, adv.to(logp.device))

    def update_chunks(self, num_items: int) -> list[list[int]]:
        """The item indices of each training step on one rollout (minibatches of `train_batch_size`)."""
        per = self.args.train_batch_size or num_items
        return [list(range(m * per, (m + 1) * per)) for m in range(num_items // per)]

    # ------------------------------------------------------------------ the team
    def build_team(self, models, names, args) -> ActorCriticTeam:
        sources = self.critic_sources
        if sources is None:  # value heads on the actors
            heads = [ValueHead(hidden_size_of(m), args.value_head_hidden_dim) for m in models]
            self.streams = [ValueStream(f"agent_{i + 1}", [i], i, False, None) for i in range(len(models))]
            return ActorCriticTeam(models, names, value_heads=heads, critic_type=args.critic_type)
        resolved, own_copy = [], []
        for s, src in enumerate(sources):
            own_copy.append(src is AGENT_COPY)
            if src is AGENT_COPY:
                agent_src = self.trainer._agent_sources[s]
                src = str(agent_src) if isinstance(agent_src, (str, os.PathLike)) else copy.deepcopy(models[s])
            elif isinstance(src, (str, os.PathLike)):  # a missing local folder: the agents' error, naming the argument
                check_model_source(str(src), self.critic_arguments[s])
            resolved.append(src)
        modules, index, cnames = load_critics(resolved, args.critic_value_head_hidden_dim, self.critic_loading)
        self.critic_names = [cnames[index.index(k)] for k in range(len(modules))]
        n, tokenizers = len(models), self.trainer.tokenizers
        if len(resolved) == 1:
            self.streams = [ValueStream("critic", list(range(n)), None, self.joint_critic, 0)]
        else:
            self.streams = [
                ValueStream(f"critic_{s + 1}", [s], s, self.joint_critic, index[s]) for s in range(len(resolved))
            ]
        for s, stream in enumerate(self.streams):
            if own_copy[s]:
                continue
            module = modules[stream.module]
            name = cnames[s]
            if self.joint_critic:
                label = (
                    f"the centralized critic ({name!r})" if len(self.streams) == 1 else f"critic {s + 1} ({name!r})"
                )
                reader, why = "agent 1", "the joint critic input is tokenized with agent 1's tokenizer"
                tok = tokenizers[0]
            else:
                label, reader, why, tok = f"critic {s + 1} ({name!r})", f"agent {s + 1}", None, tokenizers[s]
            check_critic_tokenizer(module, resolved[s], tok, label, reader, why)
        if args.disable_dropout:
            for m in modules:
                disable_dropout_in_model(m)
        team = ActorCriticTeam(models, names, critics=modules, critic_type=args.critic_type)
        if args.parallel_training == "mp":
            for k, m in enumerate(modules):
                m.to(self.critic_device(k, args))
            team._critic_device_map = {f"critics.{k}": self.critic_device(k, args) for k in range(len(modules))}
        return team

    def critic_device(self, k: int, args: ActorCriticConfig | None = None) -> str:
        """The device of critic module k in `mp` mode (the device of the first critic it serves)."""
        devs = (args or self.args).critic_devices
        first = next(s for s, st in enumerate(self.streams) if st.module == k)
        return devs[0] if len(devs) == 1 else devs[first]

    def critic_tokenizer(self, k: int):
        """The tokenizer whose ids critic k reads."""
        stream = next(st for st in self.streams if st.module == k)
        return self.trainer.tokenizers[0] if stream.joint else self.trainer.tokenizers[stream.agents[0]]

    def _critic_learning_rate(self) -> float:
        lr = self.args.critic_learning_rate
        return agent_learning_rate(self.args, 0) if lr is None else lr

    def extra_param_groups(self, team, decay: set[str]) -> list[dict]:
        """One group per separate critic at `critic_learning_rate`; value heads at their agent's learning rate."""
        groups: list[dict] = []
        wd = self.args.weight_decay
        for k, critic in enumerate(team.critics):
            named = [(f"critics.{k}.{name}", p) for name, p in critic.named_parameters() if p.requires_grad]
            label = "critic" if len(team.critics) == 1 else f"critic_{k + 1}"
            groups += decay_groups(named, decay, wd, self._critic_learning_rate(), label)
        if team.value_heads is not None:
            for i, head in enumerate(team.value_heads):
                named = [(f"value_heads.{i}.{name}", p) for name, p in head.named_parameters() if p.requires_grad]
                groups += decay_groups(named, decay, wd, agent_learning_rate(self.args, i), f"value_head_{i + 1}")
        return groups

    def extra_clip_groups(self) -> list[list[torch.nn.Parameter]]:
        """Each critic and each value head is clipped by its own norm (`MultiAgentTrainer._clip_grad_norm`)."""
        team = self.team
        modules = list(team.critics) + list(team.value_heads or [])
        return [[p for p in m.parameters() if p.requires_grad] for m in modules]

    # ------------------------------------------------------------------ sequential critic updates (MAAC)
    def _critic_updates_in_engine(self) -> bool:
        """Whether the critic can only be stepped by the engine (DeepSpeed / FSDP own its parameters)."""
        return bool(self.trainer.is_deepspeed_enabled or self.trainer.is_fsdp_enabled)

    def extra_critic_updates_per_step(self) -> int:
        """MAAC: the shared critic is updated with each agent's batch in turn. The Trainer's optimizer step is the
        first agent's update; `n - 1` more critic-only steps follow it. 0 for the other trainers, and under
        DeepSpeed / FSDP (there the critic loss is weighted `n` in the one step: the first-order equivalent)."""
        if not self.critic_loss_per_agent_batch or self._critic_updates_in_engine():
            return 0
        return sum(len(st.agents) for st in self.streams if st.module is not None) - 1

    def _critic_loss(self, critic_values: list, where, rows_t: torch.Tensor, data: CriticData) -> torch.Tensor:
        """`value_loss_coef` times the sum over value streams of the value loss on these rows."""
        out = {"critic_values": critic_values, "values": [None] * self.trainer.num_agents}
        total = 0.0
        for s, stream in enumerate(self.streams):
            if stream.module is None:
                continue
            values = self._stream_values(out, where, s)
            targets = data.targets[s][rows_t].to(values.device)
            old = data.old_values[s][rows_t].to(values.device)
            total = total + self.args.value_loss_coef * value_loss(
                values, targets, old, self._value_clip_range(stream)
            )
        return total

    def sequential_critic_updates(self) -> None:
        """After the optimizer step (the first agent's critic update, together with the actors'), update the shared
        critic with each further agent's batch in turn: forward on the updated critic, backward, gradients averaged
        over processes, clipped by the critic's own norm, one step of the same optimizer (only the critic has
        gradients, so only it moves). Every micro-batch of the step's accumulation window takes part in each update,
        as in the first."""
        window, self.critic_window = self.critic_window, []
        extra = self.extra_critic_updates_per_step()
        if not extra or not window:
            return
        t, team = self.trainer, self.team
        params = [p for c in team.critics for p in c.parameters() if p.requires_grad]
        opt = getattr(t.optimizer, "optimizer", t.optimizer)  # the torch optimizer (no loss scaler)
        for _ in range(extra):
            for p in t.model.parameters():
                p.grad = None
            value_losses = []
            for critic_batches, where, rows_t, data in window:
                values = [
                    None if cb is None else critic(*(x.to(next(critic.parameters()).device) for x in cb[:2]))
                    for critic, cb in zip(team.critics, critic_batches)
                ]
                loss = self._critic_loss(values, where, rows_t, data) / len(window)
                loss.backward()
                value_losses.append(loss.item() * len(window) / self.args.value_loss_coef)
            if t.accelerator.num_processes > 1:
                for p in params:
                    if p.grad is not None:
                        p.grad.copy_(t.accelerator.reduce(p.grad, reduction="mean"))
            if self.args.max_grad_norm and self.args.max_grad_norm > 0:
                for group in self.extra_clip_groups()[: len(team.critics)]:
                    torch.nn.utils.clip_grad_norm_([p for p in group if p.grad is not None], self.args.max_grad_norm)
            opt.step()
            t._metrics["train"]["critic/sequential_value_loss"].append(sum(value_losses) / len(value_losses))
        for p in t.model.parameters():
            p.grad = None

    def extra_grad_norm_modules(self) -> list[tuple[str, torch.nn.Module]]:
        """Each critic and value head (logged beside the agents)."""
        team = self.team
        named = [(self.critic_folder(k), c) for k, c in enumerate(team.critics)]
        named += [(f"value_head_{i + 1}", h) for i, h in enumerate(team.value_heads or [])]
        return named

    # ------------------------------------------------------------------ rollout: frozen targets and advantages
    def experience(self, rollout: Rollout, returns: RolloutReturns) -> Experience:
        """The critics' frozen targets and each agent's advantages (`critic_targets`): every training step on the
        rollout gets them as `critic`."""
        data = self.critic_targets(rollout)
        num_nodes = len(rollout.nodes)  # one step per joint action, node by node: `(num_nodes, G)` per agent
        return Experience([adv.view(num_nodes, -1) for adv in data.advantages], {"critic": data})

    def _stream_inputs(self, rollout: Rollout, trans: Transitions, stream: ValueStream) -> list[torch.Tensor] | None:
        """Per step, the token ids a separate critic reads (None for value heads)."""
        if stream.module is None:
            return None
        q = self.args.critic_type == "q"
        out = []
        if stream.joint:
            texts = []
            for nid, j in zip(trans.node, trans.joint):
                node = rollout.nodes[nid]
                ks = node.joint[j]
                completions = [rollout.samples[node.samples[a][k]].completion for a, k in enumerate(ks)] if q else None
                texts.append(valid_text(joint_critic_text(node.prompts, completions)))  # tokenizer input
            tok = self.trainer.tokenizers[0]
            limit = self.args.critic_max_length  # joint critics: MAAC / MAPPO configs
            for ids in tok(texts, add_special_tokens=True)["input_ids"]:
                ids = ids[-limit:] if limit is not None else ids
                out.append(torch.tensor(ids, dtype=torch.long))
            return out
        a = stream.agents[0]
        for nid, j in zip(trans.node, trans.joint):
            node = rollout.nodes[nid]
            sample = rollout.samples[node.samples[a][node.joint[j][a]]]
            out.append(torch.cat([sample.prompt_ids, sample.completion_ids]) if q else sample.prompt_ids.clone())
        return out

    def critic_batches(
        self, inputs: list[list[torch.Tensor] | None], rows: Sequence[int]
    ) -> tuple[list[CriticBatch | None] | None, list[tuple[int, int, int] | None]]:
        """Batch the rows of every stream per critic module; `where[s] = (module, start, end)` in its output."""
        team = self.team
        per_module: list[list[torch.Tensor]] = [[] for _ in team.critics]
        where: list[tuple[int, int, int] | None] = []
        for s, stream in enumerate(self.streams):
            if stream.module is None:
                where.append(None)
                continue
            seqs = [inputs[s][r] for r in rows]
            start = len(per_module[stream.module])
            per_module[stream.module].extend(seqs)
            where.append((stream.module, start, start + len(seqs)))
        if not team.critics:
            return None, where
        batches = [
            collate_critic_batch(seqs, self.critic_tokenizer(k).pad_token_id) if seqs else None
            for k, seqs in enumerate(per_module)
        ]
        return batches, where

    def _stream_values(self, out: dict, where, s: int) -> torch.Tensor:
        stream = self.streams[s]
        if stream.module is None:
            return out["values"][stream.agents[0]]
        k, a, b = where[s]
        return out["critic_values"][k][a:b]

    @torch.no_grad()
    def critic_targets(self, rollout: Rollout) -> CriticData:
        """Evaluate the critics on the rollout (ONE team call, no grad) and freeze targets and advantages."""
        n = self.trainer.num_agents
        trans = [build_transitions(rollout, st.reward_agent) for st in self.streams]
        S = len(trans[0])
        inputs = [self._stream_inputs(rollout, trans[s], st) for s, st in enumerate(self.streams)]
        heads = self.team.value_heads is not None
        agent_batches = [
            self.trainer.agent_batch(i, rollout.samples_of_agent(i)) if heads or self.needs_old_logprobs else None
            for i in range(n)
        ]
        critic_batches, where = self.critic_batches(inputs, range(S))
        with unwrap_model_for_generation(self.trainer.model_wrapped, self.trainer.accelerator) as team:
            out = team(agent_batches, critic_batches)
        raw = [self._stream_values(out, where, s).detach().float().cpu() for s in range(len(self.streams))]

        # values in reward units -> advantages and targets (frozen for the update)
        norms = self.normalizers
        values = [norms[st.module].denormalize(raw[s]) if norms else raw[s] for s, st in enumerate(self.streams)]
        advs, targets = zip(*(self._advantages(trans[s], values[s]) for s in range(len(self.streams))))
        old_values, fit_targets = list(raw), list(targets)
        if norms:
            old_values, fit_targets = self._normalize_targets(values, raw, list(targets))

        # per agent: its stream's advantage of each of its samples, normalized inside (agent, turn) groups
        turns = torch.tensor(trans[0].turn)
        stream_of = {i: s for s, st in enumerate(self.streams) for i in st.agents}
        advantages = []
        m = self.trainer._metrics["train"]
        for i in range(n):
            adv = advs[stream_of[i]].clone()
            m[f"agent_{i + 1}/td_error_mean"].append(adv.mean().item() if S else 0.0)
            if self.normalize_advantages:  # over the global batch: every process's share of it
                adv = normalize_in_groups(adv, turns, self._sum_over_processes)
            m[f"agent_{i + 1}/advantage_std"].append(adv.std(unbiased=False).item() if S else 0.0)
            advantages.append(adv)
        for s, st in enumerate(self.streams):
            m[f"{st.name}/value_mean"].append(values[s].mean().item() if S else 0.0)
            m[f"{st.name}/target_mean"].append(targets[s].mean().item() if S else 0.0)

        old_logprobs = None
        if self.needs_old_logprobs:
            old_logprobs = []
            for i in range(n):
                lp, mask = out["logprobs"][i].detach().float().cpu(), agent_batches[i].completion_mask
                old_logprobs.append([lp[r, : int(mask[r].sum())] for r in range(lp.shape[0])])
        return CriticData(list(trans[0].item), fit_targets, old_values, inputs, advantages, old_logprobs)

    def _sum_over_processes(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over the data-parallel processes (itself in a one-process run)."""
        acc = self.trainer.accelerator
        if acc.num_processes == 1:
            return t
        return acc.reduce(t.to(acc.device), reduction="sum").cpu()

    def _normalize_targets(self, values, raw, targets):
        """Value normalization (MAPPO): update each critic's running statistics with its targets (those of every
        process), optionally rescale the head (PopArt), and express targets and rollout-time predictions in the
        critic's output space."""
        norms = self.normalizers
        team = self.team
        for k, rms in enumerate(norms):
            streams = [s for s, st in enumerate(self.streams) if st.module == k]
            old_mean, old_std = rms.mean, rms.std
            batch = torch.cat([targets[s] for s in streams])
            if self.trainer.accelerator.num_processes > 1:  # identical statistics (and PopArt rescales) everywhere
                batch = torch.tensor([v for part in gather_object([batch.tolist()]) for v in part])
            rms.update(batch)
            if self.args.popart:
                out_layer = team.critics[k].value_head.out
                w, b = popart_rescale(out_layer.weight.data, out_layer.bias.data, old_mean, old_std, rms.mean, rms.std)
                out_layer.weight.data.copy_(w)
                out_layer.bias.data.copy_(b)
        old_values, fit = [], []
        for s, st in enumerate(self.streams):
            rms = norms[st.module]
            old_values.append(rms.normalize(values[s]) if self.args.popart else raw[s])
            fit.append(rms.normalize(targets[s]))
        return old_values, fit

    # ------------------------------------------------------------------ the update
    def compute_loss(self, model: torch.nn.Module, inputs: dict) -> torch.Tensor:
        """Actor losses plus `value_loss_coef` times the critic losses, from ONE team forward call.

        The targets and advantages come frozen from the rollout; each agent's loss touches only its own parameters,
        each critic loss only its critic (and, for value heads, the actor's backbone).
        """
        t, (rollout, items, data) = self.trainer, (inputs["rollout"], inputs["items"], inputs["critic"])
        keep = set(items)
        rows = [s for s, it in enumerate(data.items) if it in keep]
        rows_t = torch.tensor(rows, dtype=torch.long)
        nodes = rollout.nodes_of_items(items)
        batches = [t.agent_batch(i, rollout.samples_of_agent(i, nodes)) for i in range(t.num_agents)]
        critic_batches, where = self.critic_batches(data.critic_inputs, rows)
        out = model(batches, critic_batches=critic_batches)
        m = t._metrics["train"]
        losses = []
        for i in range(t.num_agents):
            logp = out["logprobs"][i]
            loss_i = self._actor_loss(i, logp, batches[i], data.advantages[i][rows_t], data, rows)
            losses.append(loss_i)
            m[f"agent_{i + 1}/loss"].append(loss_i.item())
        sequential = self.extra_critic_updates_per_step() > 0
        for s, stream in enumerate(self.streams):
            values = self._stream_values(out, where, s)
            targets = data.targets[s][rows_t].to(values.device)
            old = data.old_values[s][rows_t].to(values.device)
            vl = value_loss(values, targets, old, self._value_clip_range(stream))
            m[f"{stream.name}/value_loss"].append(vl.item())
            # MAAC: the critic's update with the first agent's batch; the others follow the optimizer step
            # (sequential_critic_updates). Under DeepSpeed / FSDP: n times the loss in this one step instead.
            per_agent = self.critic_loss_per_agent_batch and not sequential
            weight = self.args.value_loss_coef * (len(stream.agents) if per_agent else 1)
            losses.append(weight * vl)
        if sequential and t.model.training and critic_batches is not None:
            self.critic_window.append(
                (
                    [None if cb is None else (cb.input_ids, cb.attention_mask) for cb in critic_batches],
                    where,
                    rows_t,
                    data,
                )
            )
        t._metrics.record_entropy(out["entropy"])
        device = losses[0].device
        return sum(loss.to(device) for loss in losses)

    # ------------------------------------------------------------------ saving
    def critic_folder(self, k: int) -> str:
        return "critic" if len(self.team.critics) == 1 else f"critic_{k + 1}"

    def save_extra(self, output_dir: str, state_dict: dict) -> None:
        """`critic/` (one critic) or `critic_1/ ... critic_n/`, each a `CausalLMWithValueHead` folder with the
        tokenizer it reads (and `value_normalizer.json` under value normalization); value heads on the actors go
        into `agent_i/value_head.safetensors`."""
        team = self.team
        for k, critic in enumerate(team.critics):
            prefix = f"critics.{k}."
            sub = {key[len(prefix) :]: v for key, v in state_dict.items() if key.startswith(prefix)}
            folder = os.path.join(output_dir, self.critic_folder(k))
            critic.save_pretrained(folder, state_dict=sub or None, tokenizer=self.critic_tokenizer(k))
            if self.normalizers is not None:
                with open(os.path.join(folder, NORMALIZER_FILE), "w", encoding="utf-8") as f:
                    json.dump(self.normalizers[k].state_dict(), f, indent=2)
        if team.value_heads is not None:
            for i, head in enumerate(team.value_heads):
                prefix = f"value_heads.{i}."
                sub = {key[len(prefix) :]: v for key, v in state_dict.items() if key.startswith(prefix)}
                save_value_head(head, os.path.join(output_dir, f"agent_{i + 1}"), sub or None)

    def load_extra(self, checkpoint: str, team) -> None:
        """Restore what `save_extra` wrote (critics, value heads, value-normalization statistics)."""
        from safetensors.torch import load_file

        for k, critic in enumerate(team.critics):
            folder = os.path.join(checkpoint, self.critic_folder(k))
            fix = f"delete {checkpoint} and resume from the checkpoint before it"
            load_weights(critic.model, folder)
            try:
                head = load_value_head(folder)
            except Exception as exc:  # noqa: BLE001 -- a missing / damaged value head file
                problem = f"its value head is unreadable ({type(exc).__name__}: {exc})"
                raise CorruptedStateError(folder, problem, fix) from exc
            critic.value_head.load_state_dict(head.state_dict())
            norm_file = os.path.join(folder, NORMALIZER_FILE)
            if self.normalizers is not None and os.path.exists(norm_file):
                stats = read_json_state(norm_file, fix)
                if not {"mean", "var", "count"} <= set(stats):
                    raise CorruptedStateError(norm_file, "it lacks mean / var / count", fix)
                self.normalizers[k].load_state_dict(stats)
        if team.value_heads is not None:
            for i, head in enumerate(team.value_heads):
                folder = os.path.join(checkpoint, f"agent_{i + 1}")
                head.load_state_dict(load_file(os.path.join(folder, VALUE_HEAD_WEIGHTS)))

    def describe(self, desc: dict) -> dict:
        """Adds the critic type, each critic's folder, source, input and agents, and the value heads' files."""
        desc["critic_type"] = self.args.critic_type
        team = self.team
        desc["critics"] = [
            {
                "folder": self.critic_folder(k),
                "source": self.critic_names[k],
                "reads": "joint prompts" if self.joint_critic else "its agent's own history",
                "serves_agents": sorted({i + 1 for st in self.streams if st.module == k for i in st.agents}),
            }
            for k in range(len(team.critics))
        ]
        if team.value_heads is not None:
            desc["value_heads"] = [f"agent_{i + 1}/value_head.safetensors" for i in range(len(team.value_heads))]
        return desc


class _SequentialCriticCallback(TrainerCallback):
    """Runs `sequential_critic_updates` right after each optimizer step (before the scheduler and `zero_grad`)."""

    def __init__(self, step: ActorCriticStep):
        self.step = step

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.step.sequential_critic_updates()
        return control
