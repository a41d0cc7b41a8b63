"""Sharing a team: model cards, `push_to_hub` in both layouts, `hub_strategy` pushes, `AgentTeam.from_pretrained`.

No network: a small Hub server runs in the test process (`FakeHub`). It answers the endpoints huggingface_hub's
`HfApi.create_repo` / `upload_folder` call (`/api/repos/create`, `/api/validate-yaml`, `.../preupload/{rev}`,
`.../commit/{rev}`; the single-commit path, with hf_xet switched off) and the ones `snapshot_download` calls
(`.../revision/{rev}`, `.../tree/{rev}`, `/{repo}/resolve/{rev}/{path}`), stores what is committed and records every
request. The real `HfApi` talks to it over HTTP: nothing of our code or of huggingface_hub is mocked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import torch

TOKEN = "hf_TESTtokenNEVERinFILES0123456789"
REPO = "tester/marl-team"


# ------------------------------------------------------------------------------------------------ the local Hub
class FakeHub:
    """A minimal Hugging Face Hub: repos with files on one branch, every request recorded."""

    def __init__(self):
        self.requests: list[dict] = []
        self.repos: dict[str, dict] = {}
        self.lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub._handle(self, "GET")

            def do_HEAD(self):
                hub._handle(self, "HEAD")

            def do_POST(self):
                hub._handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    # -------------------------------------------------------------- helpers for the tests
    def files(self, repo: str) -> dict[str, bytes]:
        return self.repos[repo]["files"]

    def commits(self, repo: str) -> list[dict]:
        return self.repos[repo]["commits"]

    def created(self) -> dict[str, dict]:
        """repo id -> the JSON payload of its create request (the first one)."""
        out = {}
        for r in self.requests:
            if r["path"] == "/api/repos/create":
                p = json.loads(r["body"])
                out.setdefault(f"{p['organization'] or 'tester'}/{p['name']}", p)
        return out

    # -------------------------------------------------------------- the server
    def _reply(self, h, status: int, payload=None, body: bytes | None = None, headers: dict | None = None, head=False):
        data = body if body is not None else json.dumps(payload if payload is not None else {}).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json" if body is None else "application/octet-stream")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if not head:
            h.wfile.write(data)

    def _not_found(self, h, head=False):
        self._reply(h, 404, {"error": "Repository not found"}, headers={"X-Error-Code": "RepoNotFound"}, head=head)

    def _handle(self, h, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        url = urlsplit(h.path)
        path = unquote(url.path)
        with self.lock:
            self.requests.append(
                {"method": method, "path": path, "query": url.query, "headers": dict(h.headers), "body": body}
            )
        head = method == "HEAD"
        if method == "POST" and path == "/api/repos/create":
            p = json.loads(body)
            repo = f"{p['organization'] or 'tester'}/{p['name']}"
            with self.lock:
                if repo in self.repos:
                    return self._reply(
                        h, 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo}"}
                    )
                self.repos[repo] = {"payload": p, "files": {}, "commits": [], "sha": "0" * 40}
            return self._reply(h, 200, {"url": f"{self.url}/{repo}", "name": repo})
        if method == "POST" and path == "/api/validate-yaml":
            return self._reply(h, 200, {"errors": [], "warnings": []})
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(preupload|commit|revision|tree)/([^/]+)(/.*)?", path)
        if m:
            repo, kind = m.group(1), m.group(2)
            if repo not in self.repos:
                return self._not_found(h, head)
            state = self.repos[repo]
            if kind == "preupload":
                files = json.loads(body)["files"]
                answer = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                return self._reply(h, 200, {"files": answer})
            if kind == "commit":
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                commit = {"message": lines[0]["value"]["summary"], "files": []}
                with self.lock:
                    for op in lines[1:]:
                        assert op["key"] == "file", op  # every file is a regular (base64) blob here
                        content = base64.b64decode(op["value"]["content"])
                        state["files"][op["value"]["path"]] = content
                        commit["files"].append(op["value"]["path"])
                    state["commits"].append(commit)
                    state["sha"] = hashlib.sha1(f"{repo}{len(state['commits'])}".encode()).hexdigest()
                return self._reply(
                    h, 200, {"commitUrl": f"{self.url}/{repo}/commit/{state['sha']}", "commitOid": state["sha"]}
                )
            if kind == "revision":
                siblings = [{"rfilename": p} for p in sorted(state["files"])]
                return self._reply(h, 200, {"id": repo, "sha": state["sha"], "siblings": siblings}, head=head)
            entries = [
                {"type": "file", "path": p, "size": len(c), "oid": _blob_oid(c)}
                for p, c in sorted(state["files"].items())
            ]
            return self._reply(h, 200, entries, head=head)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and method in ("GET", "HEAD"):
            repo, file = m.group(1), m.group(3)
            if repo not in self.repos:
                return self._not_found(h, head)
            state = self.repos[repo]
            if file not in state["files"]:
                return self._reply(
                    h, 404, {"error": "not found"}, headers={"X-Error-Code": "EntryNotFound"}, head=head
                )
            content = state["files"][file]
            headers = {"X-Repo-Commit": state["sha"], "ETag": f'"{_blob_oid(content)}"'}
            return self._reply(h, 200, body=content, headers=headers, head=head)
        self._reply(h, 404, {"error": f"no route {method} {path}"})


def _blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@pytest.fixture(scope="module")
def hub():
    """The local Hub, with huggingface_hub pointed at it (what `HF_ENDPOINT` does) and offline mode lifted."""
    from huggingface_hub import constants

    server = FakeHub()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", server.url)
        mp.setenv("HF_HUB_OFFLINE", "0")
        mp.setattr(constants, "ENDPOINT", server.url)
        mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
        mp.setattr(constants, "HF_HUB_OFFLINE", False)
        mp.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the single-commit upload path (no Xet storage here)
        yield server
    server.close()


@pytest.fixture(scope="module")
def trained(hub, tiny_path, tmp_path_factory):
    """A 2-agent MAGRPO team on the coordination task (roles first_half / second_half), one step, with
    push_to_hub on: team layout, private repo, hub_strategy="checkpoint", a checkpoint saved (and pushed) at step 1."""
    from trl_marl import MAGRPOConfig, MAGRPOTrainer, load_task

    task = load_task("coordination")
    out = tmp_path_factory.mktemp("hub") / "out"
    args = MAGRPOConfig(
        output_dir=str(out),
        num_agents=2,
        num_generations=2,
        max_completion_length=6,
        rollout_buffer_size=2,
        learning_rate=1e-2,
        max_steps=1,
        save_strategy="steps",
        save_steps=1,
        report_to="none",
        disable_tqdm=True,
        seed=0,
        push_to_hub=True,
        hub_model_id=REPO,
        hub_token=TOKEN,
        hub_private_repo=True,
        hub_strategy="checkpoint",
    )
    trainer = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=task.reward_func,
        formatters=task.formatters,
        args=args,
        train_dataset=task.train_dataset,
    )
    trainer.train()
    trainer._finish_current_push()  # the checkpoint push runs in the background
    trainer.save_model()  # the team at the output_dir root: every test below may read it, in any order
    return trainer


def _all_uploaded(hub: FakeHub) -> dict[str, bytes]:
    return {f"{repo}:{p}": c for repo, s in hub.repos.items() for p, c in s["files"].items()}


def _assert_token_only_in_authorization(hub: FakeHub) -> None:
    for r in hub.requests:
        assert TOKEN.encode() not in r["body"], r["path"]
        assert TOKEN not in r["path"] + r["query"]
        for k, v in r["headers"].items():
            if k.lower() == "authorization":
                assert v == f"Bearer {TOKEN}", (r["path"], v)
            else:
                assert TOKEN not in v, (r["path"], k)
    for name, content in _all_uploaded(hub).items():
        assert TOKEN.encode() not in content, name
        assert not name.endswith("training_args.bin"), name


def _weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


# ------------------------------------------------------------------------------------------------------ tests
def test_save_writes_agent_and_team_cards(trained):
    out = trained.args.output_dir
    trained.save_model(out)
    team = json.loads(Path(out, "team.json").read_text())
    assert [a["role"] for a in team["agents"]] == ["first_half", "second_half"]
    assert team["training_config"]["num_agents"] == 2 and "hub_token" not in team["training_config"]
    card1 = Path(out, "agent_1", "README.md").read_text()
    assert "MAGRPO" in card1 and "role **first_half**" in card1
    assert "| 2 | second_half |" in card1 and "| 1 | first_half |" not in card1  # names the OTHER agents
    assert '"learning_rate": 0.01' in card1  # the training config
    team_card = Path(out, "README.md").read_text()
    assert "| 1 | first_half |" in team_card and "| 2 | second_half |" in team_card
    for root, _, names in os.walk(out):
        for name in names:
            if name != "training_args.bin":  # transformers' pickle of the config: holds the token, never uploaded
                assert TOKEN.encode() not in Path(root, name).read_bytes(), name


def test_checkpoint_strategy_pushed_during_training(hub, trained):
    assert hub.created()[REPO]["visibility"] == "private"
    messages = [c["message"] for c in hub.commits(REPO)]
    assert "Training in progress, step 1" in messages
    assert "Training in progress, step 1, checkpoint" in messages
    files = hub.files(REPO)
    for f in ("team.json", "README.md", "agent_1/model.safetensors", "agent_2/tokenizer.json", "agent_2/README.md"):
        assert f in files, f
    # hub_strategy="checkpoint": the whole training state under last-checkpoint/ (for resuming), minus the args pickle
    for f in (
        "last-checkpoint/optimizer.pt",
        "last-checkpoint/trainer_state.json",
        "last-checkpoint/agent_1/config.json",
    ):
        assert f in files, f
    assert not any(p.startswith("checkpoint-") for p in files)
    _assert_token_only_in_authorization(hub)


def test_push_to_hub_team_layout(hub, trained):
    result = trained.push_to_hub(commit_message="final team", dataset_name="coordination")
    assert result.oid == hub.repos[REPO]["sha"]
    commit = hub.commits(REPO)[-1]
    assert commit["message"] == "final team"
    uploaded = set(commit["files"])
    expected = {"README.md", "team.json"} | {
        f"agent_{i}/{f}"
        for i in (1, 2)
        for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "README.md")
    }
    assert expected <= uploaded, expected - uploaded
    assert not any(p.startswith(("checkpoint-", "last-checkpoint")) or "training_args" in p for p in uploaded)
    card = hub.files(REPO)["agent_2/README.md"].decode()
    assert "MAGRPO" in card and "role **second_half**" in card and "first_half" in card
    assert f'AgentTeam.from_pretrained("{REPO}")' in card and 'subfolder="agent_2"' in card
    assert "coordination" in hub.files(REPO)["README.md"].decode()  # dataset_name reaches the card
    _assert_token_only_in_authorization(hub)


def test_push_per_agent_layout(hub, trained, tmp_path):
    from trl_marl import push_team_to_hub

    folder = tmp_path / "team"
    shutil.copytree(trained.args.output_dir, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    results = push_team_to_hub(folder, "tester/marl-pa", layout="per_agent", token=TOKEN, private=True)
    repos = ["tester/marl-pa-agent-1", "tester/marl-pa-agent-2"]
    assert len(results) == 2 and [r.oid for r in results] == [hub.repos[r]["sha"] for r in repos]
    created = hub.created()
    assert all(created[r]["visibility"] == "private" for r in repos)
    assert "tester/marl-pa" not in hub.repos  # no team repo in this layout
    for i, repo in enumerate(repos):
        files = hub.files(repo)
        assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "team.json"} <= set(files)
        own = json.loads(files["team.json"])
        assert own["hub"] == {"layout": "per_agent", "agent_index": i, "repo_ids": repos}
        card = files["README.md"].decode()
        other = repos[1 - i]
        assert other in card and ("second_half" if i == 0 else "first_half") in card  # the other agent
        assert f'from_pretrained("{repo}")' in card
    # a trainer, to explicit per-agent repo ids (its token / private settings come from its config)
    results = push_team_to_hub(trained, ["tester/writer", "tester/expander"], layout="per_agent")
    assert len(results) == 2
    assert [hub.commits(r)[-1]["message"] for r in ("tester/writer", "tester/expander")] == ["End of training"] * 2
    assert hub.created()["tester/writer"]["visibility"] == "private"
    assert json.loads(hub.files("tester/expander")["team.json"])["hub"]["agent_index"] == 1
    _assert_token_only_in_authorization(hub)


def test_agent_team_round_trip_local_and_decentralized(trained):
    from trl_marl import AgentTeam

    team = AgentTeam.from_pretrained(trained.args.output_dir)
    assert team.num_agents == 2 and team.roles == ["first_half", "second_half"]
    assert team.description["algorithm"] == "MAGRPO"
    for i in range(2):
        assert _weights_equal(team.agents[i], trained.team.agents[i])
    # each agent answers from its own prompt, exactly as the trained model generates (same seed, sampling)
    prompts = ["Together, describe a river. You write the first part.\n", "Describe the moon. Second part.\n"]
    for i, prompt in enumerate(prompts):
        torch.manual_seed(0)
        ours = team.generate(i, prompt, do_sample=True, max_new_tokens=8)
        model, tok = trained.team.agents[i].eval(), trained.tokenizers[i]
        enc = tok(prompt, return_tensors="pt")
        torch.manual_seed(0)
        ref = model.generate(
            **enc, do_sample=True, max_new_tokens=8, pad_token_id=tok.pad_token_id, eos_token_id=team.eos_ids[i]
        )
        assert ours == tok.decode(ref[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    # decentralized: agent 1's answer does not depend on agent 2's prompt
    a = team.act([prompts[0], prompts[1]], do_sample=False, max_new_tokens=8)
    b = team.act([prompts[0], "something else entirely"], do_sample=False, max_new_tokens=8)
    assert a[0] == b[0] and a[1] == team.generate(1, prompts[1], do_sample=False, max_new_tokens=8)
    with pytest.raises(ValueError, match="2 agents"):
        team.act([prompts[0]])


def test_agent_team_generates_from_a_prompt_with_invalid_unicode(trained):
    # old code: TypeError (TextEncodeInput must be Union[...]) tokenizing the prompt
    from trl_marl import AgentTeam

    team = AgentTeam.from_pretrained(trained.args.output_dir)
    kw = dict(do_sample=False, max_new_tokens=4)
    assert team.generate(0, "Describe \ud800 a river.", **kw) == team.generate(0, "Describe \ufffd a river.", **kw)


def test_agent_team_loads_from_the_hub_in_both_layouts(hub, trained, tmp_path):
    from trl_marl import AgentTeam, push_team_to_hub

    push_team_to_hub(trained, "tester/marl-pa", layout="per_agent", token=TOKEN)  # whatever ran before
    sources = (REPO, "tester/marl-pa", ["tester/marl-pa-agent-1", "tester/marl-pa-agent-2"], "tester/marl-pa-agent-2")
    for source in sources:  # team repo; per-agent base id; per-agent ids; one agent's repo (its team.json names all)
        team = AgentTeam.from_pretrained(source, cache_dir=str(tmp_path / "cache"), token=TOKEN)
        assert team.roles == ["first_half", "second_half"], source
        for i in range(2):
            assert _weights_equal(team.agents[i], trained.team.agents[i]), source
            assert team.tokenizers[i].get_vocab() == trained.tokenizers[i].get_vocab()
    # the team repo download skips the pushed training checkpoint
    downloads = [r["path"] for r in hub.requests if "/resolve/" in r["path"]]
    assert downloads and not any("last-checkpoint" in p for p in downloads)


def test_peft_adapter_agent_loads(tiny_path, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_marl import AgentTeam

    tok = AutoTokenizer.from_pretrained(tiny_path)
    torch.manual_seed(0)
    lora = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_path),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    lora.save_pretrained(tmp_path / "agent_1")
    tok.save_pretrained(tmp_path / "agent_1")
    full = AutoModelForCausalLM.from_pretrained(tiny_path)
    full.save_pretrained(tmp_path / "agent_2")
    tok.save_pretrained(tmp_path / "agent_2")
    description = {"algorithm": "MAGRPO", "num_agents": 2, "agents": [{"folder": "agent_1"}, {"folder": "agent_2"}]}
    (tmp_path / "team.json").write_text(json.dumps(description))

    team = AgentTeam.from_pretrained(str(tmp_path))
    assert isinstance(team.agents[0], PeftModel) and not isinstance(team.agents[1], PeftModel)
    prompt = "Write about the sun."
    enc = tok(prompt, return_tensors="pt")
    ref = lora.eval().generate(**enc, do_sample=False, max_new_tokens=6, pad_token_id=tok.pad_token_id)
    expected = tok.decode(ref[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert team.generate(0, prompt, do_sample=False, max_new_tokens=6) == expected


def test_hub_settings_are_validated(tmp_path):
    from trl_marl import MAGRPOConfig

    def cfg(**kw):
        return MAGRPOConfig(output_dir=str(tmp_path), report_to="none", **kw)

    with pytest.raises(ValueError, match="hub_team_layout must be one of"):
        cfg(hub_team_layout="flat")
    with pytest.raises(ValueError, match="not supported with hub_team_layout='per_agent'"):
        cfg(hub_team_layout="per_agent", push_to_hub=True, hub_strategy="checkpoint")
    assert cfg(hub_team_layout="team", push_to_hub=True, hub_strategy="all_checkpoints").hub_team_layout == "team"
    assert cfg(hub_team_layout="per_agent", push_to_hub=True, hub_strategy="every_save").push_to_hub


def test_safe_training_config_drops_secrets(tmp_path):
    from trl_marl import MAGRPOConfig
    from trl_marl.hub import safe_training_config

    args = MAGRPOConfig(output_dir=str(tmp_path), report_to="none", hub_token=TOKEN, trace_dir=str(tmp_path))
    config = safe_training_config(args)
    assert TOKEN not in json.dumps(config)
    assert "max_new_tokens" in config and "num_generations" in config and "learning_rate" in config
    assert not any("token" in k.split("_") or k.endswith("_dir") for k in config)


def test_hub_package_imports_no_trainer_module():
    """The trainers call the Hub code; the Hub code never imports a trainer module (no import cycle)."""
    import subprocess
    import sys

    code = (
        "import sys, trl_marl.hub\n"
        "from trl_marl.hub import AgentTeam, push_team_to_hub, safe_training_config, check_hub_settings\n"
        "from trl_marl import AgentTeam as A\n"
        "assert A is AgentTeam\n"
        "bad = sorted(m for m in sys.modules if m.startswith('trl_marl.trainers'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_team_card_metadata_library_base_models_and_no_fake_dataset():
    from trl_marl.hub import build_team_card

    description = {
        "algorithm": "MADPO",
        "num_agents": 2,
        "agents": [{"source": "org/model-a"}, {"source": "org/model-b"}],
    }
    card = build_team_card(description, repo_id="tester/team")
    assert card.data.library_name == "trl_marl"  # the root holds team.json, not a transformers config.json
    assert card.data.base_model == ["org/model-a", "org/model-b"]  # heterogeneous: the Hub's list form
    assert card.data.datasets is None and "huggingface.co/datasets" not in card.text
    assert "[None]" not in card.text and "[org/model-b](https://huggingface.co/org/model-b)" in card.text
    # the method's paper is cited even when team.json carries none (older folders)
    assert "2305.18290" in card.text and "@inproceedings{rafailov2023dpo" in card.text
    homogeneous = build_team_card({**description, "agents": [{"source": "org/model-a"}] * 2})
    assert homogeneous.data.base_model == "org/model-a"


def test_every_trainer_has_a_citation():
    import trl_marl
    from trl_marl.hub.papers import PAPERS
    from trl_marl.trainers.base import MultiAgentTrainer

    names = [n for n in trl_marl.__all__ if n.endswith("Trainer") and n != "MultiAgentTrainer"]
    classes = [getattr(trl_marl, n) for n in names]
    assert len(classes) >= 11
    for cls in classes:
        assert issubclass(cls, MultiAgentTrainer)
        paper = PAPERS.get(cls._name)
        assert paper and paper["citation"].startswith("@") and paper["id"], cls.__name__


def test_recipes_send_no_task_name_as_hub_dataset():
    import inspect

    from trl_marl.cli import recipe_args

    assert "dataset_name=task" not in inspect.getsource(recipe_args)


def test_agent_team_save_pretrained_and_push_to_hub(hub, trained, tmp_path):
    from trl_marl import AgentTeam

    team = AgentTeam.from_pretrained(trained.args.output_dir)
    team.save_pretrained(tmp_path / "copy")
    again = AgentTeam.from_pretrained(tmp_path / "copy")
    assert again.roles == team.roles and again.description["algorithm"] == "MAGRPO"
    for i in range(2):
        assert _weights_equal(again.agents[i], team.agents[i])
    assert (tmp_path / "copy" / "agent_1" / "README.md").is_file() and (tmp_path / "copy" / "README.md").is_file()
    result = team.push_to_hub("tester/saved-team", token=TOKEN)
    files = hub.files("tester/saved-team")
    assert result.oid == hub.repos["tester/saved-team"]["sha"]
    assert {"team.json", "README.md", "agent_1/model.safetensors", "agent_2/tokenizer.json"} <= set(files)
    pulled = AgentTeam.from_pretrained("tester/saved-team", cache_dir=str(tmp_path / "cache"), token=TOKEN)
    assert pulled.roles == team.roles and _weights_equal(pulled.agents[1], team.agents[1])


@pytest.mark.parametrize("network", ["unreachable", "offline_mode"])
def test_push_to_hub_without_the_hub_names_the_hub_the_repo_and_how_to_run_offline(network, tiny_path, tmp_path):
    """`push_to_hub=True` with no Hub fails in the constructor (transformers creates the repo there) with a message that
    says "Hub", the endpoint, the repository and the offline route, not a bare `ConnectError`."""
    from huggingface_hub import constants

    from trl_marl import MAGRPOConfig, MAGRPOTrainer, load_task
    from trl_marl.hub import HubError

    task = load_task("coordination")
    args = MAGRPOConfig(
        output_dir=str(tmp_path / "out"),
        num_agents=2,
        num_generations=2,
        max_completion_length=6,
        rollout_buffer_size=2,
        report_to="none",
        push_to_hub=True,
        hub_model_id="someone/team",
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
        mp.setattr(constants, "HF_HUB_OFFLINE", network == "offline_mode")
        with pytest.raises(HubError) as err:
            MAGRPOTrainer(
                model=tiny_path,
                reward_funcs=task.reward_func,
                formatters=task.formatters,
                args=args,
                train_dataset=task.train_dataset,
            )
    message = str(err.value)
    assert "Hugging Face Hub (http://127.0.0.1:9) could not create the repository someone/team" in message
    assert "push_to_hub=False" in message and "HF_HUB_OFFLINE=1" in message
