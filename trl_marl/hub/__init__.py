"""Sharing a team on the Hugging Face Hub: model cards (`cards`), pushing (`push`), and `AgentTeam` to load a team
back (`loader`); layouts and settings in `settings`. Nothing here imports the trainer modules: the trainers call
this package.

A saved team (`MultiAgentTrainer.save_model`) is a folder with one `save_pretrained` folder per agent
(`agent_1/ ... agent_n/`, each with its tokenizer and a model card `README.md`), a `team.json` describing the team
and a team-level `README.md`. It is shared in one of two layouts (`MultiAgentConfig.hub_team_layout`):

- `"team"`: ONE repo `hub_model_id` holding the folder as saved (`agent_i/`, `team.json`, `README.md`, and the
  `critic/` / `reward_model/` folders of trainers that have them).
- `"per_agent"`: one repo per agent, named `{hub_model_id}-agent-{i}` (i = 1..n, the agent's folder number), each
  holding that agent's folder at the repo root (so `AutoModelForCausalLM.from_pretrained(repo)` just works), its card,
  and a `team.json` that also lists every agent's repo. Critics and reward models are not pushed in this layout.

`AgentTeam.from_pretrained` loads either layout, from a local folder or the Hub, for decentralized execution: each
agent answers from its own prompt only.

Hub settings follow transformers: `hub_model_id`, `hub_token` (used for the requests only; it is never written to
a card, `team.json` or an uploaded file, and `training_args.bin` -- a pickle that holds it -- is never uploaded),
`hub_private_repo`, `hub_revision`, `hub_always_push` and `hub_strategy` (see `HUB_STRATEGIES`).
"""

from trl_marl.hub.cards import build_agent_card, build_team_card, write_model_cards
from trl_marl.hub.loader import AgentTeam
from trl_marl.hub.push import (
    HubError,
    init_trainer_repos,
    push_team_to_hub,
    push_trainer,
    push_trainer_checkpoint,
    trainer_repo_ids,
    write_trainer_cards,
)
from trl_marl.hub.settings import (
    CARD_FILE,
    DOWNLOAD_IGNORE,
    HUB_STRATEGIES,
    HUB_TEAM_LAYOUTS,
    TEAM_FILE,
    UPLOAD_IGNORE,
    agent_repo_id,
    agent_role,
    check_hub_settings,
    clear_saved_team,
    read_team_description,
    safe_training_config,
    saved_team_entries,
    team_metadata,
)

__all__ = [
    "AgentTeam",
    "HubError",
    "CARD_FILE",
    "DOWNLOAD_IGNORE",
    "HUB_STRATEGIES",
    "HUB_TEAM_LAYOUTS",
    "TEAM_FILE",
    "UPLOAD_IGNORE",
    "agent_repo_id",
    "agent_role",
    "build_agent_card",
    "build_team_card",
    "check_hub_settings",
    "clear_saved_team",
    "saved_team_entries",
    "init_trainer_repos",
    "push_team_to_hub",
    "push_trainer",
    "push_trainer_checkpoint",
    "read_team_description",
    "safe_training_config",
    "team_metadata",
    "trainer_repo_ids",
    "write_model_cards",
    "write_trainer_cards",
]
