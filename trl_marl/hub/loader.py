"""`AgentTeam`: a trained team loaded back (local folder or Hub, either layout) for decentralized execution."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import huggingface_hub
from huggingface_hub.errors import RepositoryNotFoundError

from trl_marl.checkpointing.checksums import verify_saved_agent
from trl_marl.checkpointing.state_files import CorruptedStateError
from trl_marl.data_types.text import valid_text
from trl_marl.hub.cards import write_model_cards
from trl_marl.hub.push import push_team_to_hub
from trl_marl.hub.settings import (
    DOWNLOAD_IGNORE,
    TEAM_FILE,
    TEAM_FILE_FIX,
    _adapter_config,
    _agent_entries,
    agent_repo_id,
    read_team_description,
)
from trl_marl.models.loading import eos_token_ids
from trl_marl.rollout.prompts import render_prompt
from trl_marl.utils.import_utils import require_extra


def _is_agent_folder(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in ("config.json", "adapter_config.json"))


def _download(repo_or_path: str, revision: str | None, token: str | None, cache_dir: str | None) -> str:
    if os.path.isdir(repo_or_path):
        return repo_or_path
    return huggingface_hub.snapshot_download(
        repo_id=repo_or_path, revision=revision, token=token, cache_dir=cache_dir, ignore_patterns=DOWNLOAD_IGNORE
    )


def _resolve_team(
    path_or_repo: str | os.PathLike | Sequence[str | os.PathLike],
    revision: str | None,
    token: str | None,
    cache_dir: str | None,
) -> tuple[list[str], dict]:
    """Local agent folders and the team description of a team in either layout, local or on the Hub."""
    if isinstance(path_or_repo, (list, tuple)):
        folders = [_download(os.fspath(p), revision, token, cache_dir) for p in path_or_repo]
        return folders, _description_of_agents(folders)
    source = os.fspath(path_or_repo)
    if os.path.isdir(source):
        folder = source
    else:
        try:
            folder = _download(source, revision, token, cache_dir)
        except RepositoryNotFoundError as team_error:
            # not a team repo: the base id of a per-agent team ({source}-agent-1, ...)?
            try:
                first = _download(agent_repo_id(source, 1), revision, token, cache_dir)
            except RepositoryNotFoundError:
                raise RepositoryNotFoundError(
                    f"neither a team repo {source!r} nor per-agent repos {agent_repo_id(source, 1)!r}, ... were "
                    "found (private repos need token=)",
                    response=team_error.response,
                ) from team_error
            folder = first
    return _team_from_folder(folder, revision, token, cache_dir)


def _team_from_folder(folder: str, revision, token, cache_dir) -> tuple[list[str], dict]:
    description = read_team_description(folder)
    if _is_agent_folder(folder):
        hub = (description or {}).get("hub") or {}  # checked by read_team_description
        if hub.get("layout") == "per_agent" and len(hub["repo_ids"]) > 1:
            # one agent of a per-agent team: fetch its teammates' repos
            me = hub["agent_index"]
            folders = [
                folder if j == me else _download(r, revision, token, cache_dir) for j, r in enumerate(hub["repo_ids"])
            ]
            return folders, description
        return [folder], description or _description_of_agents([folder])
    if description is None:
        raise FileNotFoundError(
            f"{folder} is neither a team folder (no {TEAM_FILE}) nor an agent folder (no config.json / "
            "adapter_config.json)"
        )
    folders = [os.path.join(folder, e["folder"]) for e in _agent_entries(description)]
    missing = [os.path.basename(f) for f in folders if not os.path.isdir(f)]
    if missing:
        raise CorruptedStateError(
            os.path.join(folder, TEAM_FILE),
            f"it lists agent folders that are missing beside it: {missing}",
            "download or copy the whole team folder (every agent_i/ with team.json), or " + TEAM_FILE_FIX,
        )
    return folders, description


def _description_of_agents(folders: Sequence[str]) -> dict:
    """The team description of a per-agent team: the first folder's `team.json`, else one made up from the folders."""
    for f in folders:
        d = read_team_description(f)
        if d is not None:
            n = len(_agent_entries(d))
            if n != len(folders):
                raise ValueError(f"{TEAM_FILE} of {f} describes {n} agents but {len(folders)} were given")
            return d
    return {
        "algorithm": None,
        "num_agents": len(folders),
        "agents": [{"folder": f"agent_{i + 1}", "source": str(f)} for i, f in enumerate(folders)],
    }


class AgentTeam:
    """A trained team loaded for DECENTRALIZED execution: `agents[i]` answers from its own prompt only, with its
    own tokenizer `tokenizers[i]`; nothing is shared between agents at inference.

    Attributes:
        agents: one causal LM per agent (a `PeftModel` where the saved agent was a PEFT adapter).
        tokenizers: one tokenizer per agent.
        roles: each agent's role (from `team.json`; `agent_i` when unknown).
        formatter_names: the names of the formatters that built each agent's prompts during training (callables are
            not saved: build prompts with the same formatters, e.g. `task.formatters[i](item)`).
        description: the team's `team.json` (algorithm, sources, training config, ...).
        folders: the local folder each agent was loaded from.
    """

    def __init__(
        self,
        agents: Sequence[Any],
        tokenizers: Sequence[Any],
        description: dict | None = None,
        folders: Sequence[str] | None = None,
    ):
        if len(agents) != len(tokenizers):
            raise ValueError(f"{len(agents)} agents but {len(tokenizers)} tokenizers")
        self.agents = list(agents)
        self.tokenizers = list(tokenizers)
        self.description = description or {"num_agents": len(self.agents), "agents": []}
        entries = _agent_entries({**self.description, "num_agents": len(self.agents)})
        self.roles = [e["role"] for e in entries]
        self.formatter_names = [e.get("formatter") for e in entries]
        self.folders = list(folders) if folders is not None else [None] * len(self.agents)
        self.eos_ids = [eos_token_ids(m, t) for m, t in zip(self.agents, self.tokenizers)]

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        revision: str | None = None,
        token: str | None = None,
        cache_dir: str | None = None,
        **loading_kwargs: Any,
    ) -> AgentTeam:
        """Load a team saved by a trl_marl trainer or pushed with `push_team_to_hub`, in either layout.

        Args:
            path_or_repo: a local team folder (`team.json` + `agent_i/`); a team repo id (layout `"team"`); the base
                id of a per-agent team (`{id}-agent-1`, ... are fetched); one per-agent repo (its teammates are fetched
                from the repo ids in its `team.json`); or a list of per-agent repo ids / agent folders, in agent order.
            revision: branch, tag or commit of every repo.
            token: Hub token for private repos (Authorization header only).
            cache_dir: Hub cache folder.
            loading_kwargs: passed to every agent's `from_pretrained` (`dtype`, `device_map`, ...). An agent folder with
                `adapter_config.json` is a PEFT adapter and loads through `peft.AutoPeftModelForCausalLM` (its base model
                from `base_model_name_or_path`).

        Returns:
            The team, every agent in eval mode with its tokenizer (padding token set to EOS when missing).
        """
        folders, description = _resolve_team(path_or_repo, revision, token, cache_dir)
        if token is not None:
            loading_kwargs.setdefault("token", token)
        agents, tokenizers = [], []
        for folder in folders:
            verify_saved_agent(folder)
            model = _load_agent_model(folder, **loading_kwargs)
            agents.append(model.eval())
            tokenizers.append(_load_agent_tokenizer(folder, token))
        return cls(agents, tokenizers, description, folders)

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    def __len__(self) -> int:
        return len(self.agents)

    def __repr__(self) -> str:
        algo = self.description.get("algorithm")
        return f"AgentTeam(num_agents={self.num_agents}, roles={self.roles}, algorithm={algo!r})"

    def to(self, device: str | Any) -> AgentTeam:
        """Move every agent to `device` (use `agents[i].to(...)` to place agents on different devices)."""
        for a in self.agents:
            a.to(device)
        return self

    @property
    def default_max_new_tokens(self) -> int | None:
        """The training `max_new_tokens` (from `team.json`), the default completion length of `generate`."""
        return (self.description.get("training_config") or {}).get("max_new_tokens")

    def generate(self, agent: int, prompt: str | list[dict], **generate_kwargs: Any) -> str:
        """Agent `agent` (0-based) answers `prompt` -- a string, or chat messages rendered with its tokenizer's chat
        template -- from that prompt only. Returns the completion text (special tokens removed).

        `generate_kwargs` go to `model.generate` (`max_new_tokens`, `do_sample`, `temperature`, `top_p`, ...);
        defaults: the model's generation config, `max_new_tokens` from training, the agent's EOS and padding tokens.
        The prompt is tokenized as in training (no special tokens for chat-template prompts; cut from the left to the
        training `max_prompt_length`, if any). Seed with `torch.manual_seed` for reproducible sampling.
        """
        import torch

        if not 0 <= agent < self.num_agents:
            raise IndexError(f"agent must be in [0, {self.num_agents}), got {agent}")
        model, tok = self.agents[agent], self.tokenizers[agent]
        text = render_prompt(prompt, tok)
        enc = tok(valid_text(str(text)), return_tensors="pt", add_special_tokens=not text.chat)
        limit = (self.description.get("training_config") or {}).get("max_prompt_length")
        if limit:  # as in training: long prompts keep their last `max_prompt_length` tokens
            enc = {k: v[:, -limit:] for k, v in enc.items()}
        device = next(model.parameters()).device
        kwargs: dict[str, Any] = {"pad_token_id": tok.pad_token_id, "eos_token_id": self.eos_ids[agent]}
        if self.default_max_new_tokens is not None:
            kwargs["max_new_tokens"] = self.default_max_new_tokens
        kwargs.update(generate_kwargs)
        with torch.no_grad():
            out = model.generate(
                input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device), **kwargs
            )
        return tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)

    def act(self, prompts_per_agent: Sequence[str | list[dict]], **generate_kwargs: Any) -> list[str]:
        """One decentralized step: agent i answers `prompts_per_agent[i]` (its own prompt only), in agent order.
        Returns one completion per agent; `generate_kwargs` as in `generate`."""
        if len(prompts_per_agent) != self.num_agents:
            raise ValueError(f"got {len(prompts_per_agent)} prompts for a team of {self.num_agents} agents")
        return [self.generate(i, p, **generate_kwargs) for i, p in enumerate(prompts_per_agent)]

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Save the team in the folder layout a trainer writes: `agent_1/ ... agent_n/` (each agent's
        `save_pretrained` folder with its tokenizer and card), `team.json` and the team card, so that
        `AgentTeam.from_pretrained(save_directory)` and `push_team_to_hub(save_directory, ...)` read it back.
        A per-agent team's `hub` entry (where it was downloaded from) is not carried over."""
        os.makedirs(save_directory, exist_ok=True)
        entries = _agent_entries({**self.description, "num_agents": self.num_agents})
        agents_meta = []
        for i, (model, tok, entry) in enumerate(zip(self.agents, self.tokenizers, entries)):
            folder = f"agent_{i + 1}"
            model.save_pretrained(os.path.join(save_directory, folder))
            tok.save_pretrained(os.path.join(save_directory, folder))
            agents_meta.append({**entry, "folder": folder})
        description = {k: v for k, v in self.description.items() if k != "hub"}
        description.update(num_agents=self.num_agents, agents=agents_meta)
        path = os.path.join(save_directory, TEAM_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(description, f, indent=2)
        os.replace(path + ".tmp", path)  # atomic: a reader never sees half a team.json
        write_model_cards(save_directory, description)

    def push_to_hub(
        self,
        repo_id: str | Sequence[str],
        *,
        layout: str = "team",
        token: str | None = None,
        private: bool | None = None,
        commit_message: str = "Upload team",
        revision: str | None = None,
    ) -> Any:
        """Save the team to a temporary folder (`save_pretrained`) and push it with `push_team_to_hub` in `layout`
        (`"team"`: one repo `repo_id`; `"per_agent"`: `{repo_id}-agent-{i}` or a list of repo ids). Returns the
        `CommitInfo` (`"team"`) or one per agent (`"per_agent"`)."""
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder)
            return push_team_to_hub(
                folder,
                repo_id,
                layout=layout,
                token=token,
                private=private,
                commit_message=commit_message,
                revision=revision,
            )


def _load_agent_model(folder: str, **kwargs: Any):
    from transformers import AutoModelForCausalLM

    if os.path.isfile(os.path.join(folder, "adapter_config.json")):
        AutoPeftModelForCausalLM = require_extra(
            "peft", f"the PEFT adapter agent in {folder}"
        ).AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(folder, **kwargs)
    kwargs.pop("token", None)  # a local folder needs none
    return AutoModelForCausalLM.from_pretrained(folder, **kwargs)


def _load_agent_tokenizer(folder: str, token: str | None):
    from transformers import AutoTokenizer

    has_tokenizer = any(
        os.path.isfile(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )
    source = folder
    if not has_tokenizer:
        adapter = _adapter_config(folder)
        if adapter is None or not adapter.get("base_model_name_or_path"):
            raise FileNotFoundError(f"no tokenizer in {folder}")
        source = adapter["base_model_name_or_path"]
    tok = AutoTokenizer.from_pretrained(source, **({"token": token} if token and source != folder else {}))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
