"""Iterative preference training: aligned pairs, round files, comparators (built-in and plugins), replay, resume."""

import http.server
import json
import os
import sys
import threading
import uuid

import pytest
import torch
from conftest import iterative_args, letters_reward
from datasets import Dataset
from safetensors.torch import load_file

from trl_marl import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig, MARLHFIterTrainer
from trl_marl.plugins.comparators import FixedModelComparator, ModelComparator
from trl_marl.trainers.preference.pairs import select_aligned_pairs
from trl_marl.trainers.preference.round_files import read_round_file, round_pairs_sha256, write_round_file


def iter_args(tmp_path, cls=MADPOIterConfig, **kw):
    base = dict(max_completion_length=6, rollout_buffer_size=4, preference_num_candidates=3, train_batch_size=4)
    return iterative_args(tmp_path, cls, **{**base, "eval_num_samples": 2, **kw})


def record_reward_models(trainer) -> list:
    """Every reward model `trainer.fit_reward_model` fits from now on, in order."""
    models = []
    original = trainer.fit_reward_model

    def spy():
        models.append(original())
        return models[-1]

    trainer.fit_reward_model = spy
    return models


@pytest.fixture
def small_items():
    return Dataset.from_list(
        [{"prompt": f"Say something about {w}."} for w in ["rain", "snow", "wind", "fire", "stone", "gold"]]
    )


# ---------------------------------------------------------------- pure pieces
def test_select_aligned_pairs():
    target = [0.5, 0.2, 0.9, 0.4]
    comp = [0.1, 0.2, None, 0.8]  # index 1 ties, index 2 was dropped
    assert select_aligned_pairs(target, comp, "all") == [(0, True), (3, False)]
    # comparator_reward: comparator score first (0.8 before 0.1), either side may win
    assert select_aligned_pairs(target, comp, "comparator_reward") == [(3, False), (0, True)]
    assert select_aligned_pairs(target, comp, "reward_gap", limit=1) == [(0, True)]  # gaps .4 == .4 -> index order
    assert select_aligned_pairs(target, [0.1], "all") == [(0, True)]  # only indices present on both sides


def test_round_file_is_written_atomically(tmp_path):
    path = tmp_path / "replay" / "iteration_0001.json"
    rec = {"prompts": ["a"], "winner_completions": ["b"], "loser_completions": ["c"]}
    rec.update(winner_reward=1.0, loser_reward=0.0, candidate_reward_mean=0.5)
    write_round_file(str(path), 1, [rec])
    expected = {"iteration": 1, "num_pairs": 1, "sha256": round_pairs_sha256([rec]), "pairs": [rec]}
    assert read_round_file(str(path)) == expected

    class Boom:  # not JSON-serialisable: the write fails half-way
        pass

    with pytest.raises(TypeError):
        write_round_file(str(path), 2, [{"x": Boom()}])
    assert read_round_file(str(path))["iteration"] == 1  # the old file is intact
    assert [p.name for p in path.parent.iterdir()] == ["iteration_0001.json"]  # no temp file left


# ---------------------------------------------------------------- config validation
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"comparator_policy": "oracle"}, "Unknown comparator 'oracle'.*'api', 'current', 'current_copy', 'history'"),
        ({"preference_replay_mode": "fifo"}, "Unknown replay mode 'fifo'"),
        ({"preference_replay_sample_size": 8}, "preference_replay_sample_size"),
        ({"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 1.5}, "preference_replay_lambda"),
        ({"num_rounds": 0}, "num_rounds must be >= 1"),
        ({"comparator_kwargs": {"k": 2}}, r"\['k'\] is not an option of the 'current' comparator; its options are"),
        ({"num_turns": 2}, "needs num_turns=1"),
    ],
)
def test_iterative_config_errors(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        iter_args(tmp_path, **overrides)


@pytest.mark.parametrize(
    "policy, options, message",
    [
        ("model", {}, r"'model' needs comparator_kwargs\['model_name'\].*or comparator_kwargs\['agents'\]"),
        (
            "model",
            {"model_name": "m", "agents": ["a", "b"]},
            r"model_name'\] or comparator_kwargs\['agents'\], not both",
        ),
        ("model", {"agents": ["a"]}, r"comparator_kwargs\['agents'\] has 1 entries but num_agents is 2"),
        ("api", {}, r"comparator_policy='api' needs comparator_kwargs\['url'\]"),
        ("api", {"url": "http://127.0.0.1:1/x", "format": "claude"}, r"comparator_kwargs\['format'\] must be one of"),
        ("history", {"k": 0}, r"comparator_kwargs\['k'\] must be >= 1"),
        ("current_copy", {"devices": ["cpu"] * 3}, r"comparator_kwargs\['devices'\] has 3 entries; give 1 or"),
        ("current", {"generation_mode": "joint"}, r"comparator_kwargs\['generation_mode'\] must be one of"),
        (
            "current",
            {"centralized_agent_index": 2},
            r"comparator_kwargs\['centralized_agent_index'\] must be in \[0, 1\]",
        ),
        (
            "api",
            {"url": "http://127.0.0.1:1/x", "api_key": "sk-lit"},
            r"\['api_key'\] is not an option.*keys never go",
        ),
    ],
)
def test_comparator_options_are_checked_with_the_config(tmp_path, policy, options, message):
    """Before any model loads: the options of the chosen built-in comparator (its `options_class`)."""
    with pytest.raises(ValueError, match=message) as err:
        iter_args(tmp_path, comparator_policy=policy, comparator_kwargs=options)
    assert "sk-lit" not in str(err.value)


ALIAS_CASES = [  # (deprecated field, value, comparator_policy, the other options it needs)
    ("comparator_generation_mode", "centralized", "current", {}),
    ("comparator_centralized_agent_index", 1, "current", {}),
    ("comparator_model_name", "some/model", "model", {}),
    ("comparator_agents", ["a", "b"], "model", {}),
    ("comparator_devices", ["cpu"], "current_copy", {}),
    ("comparator_history_k", 2, "history", {}),
    ("comparator_api_url", "http://127.0.0.1:1/x", "api", {}),
    ("comparator_api_format", "openai", "api", {"model": "m"}),
    ("comparator_api_model", "m", "api", {}),
    ("comparator_api_key_env", "ACME_KEY", "api", {}),
    ("comparator_api_timeout", 5.0, "api", {}),
    ("comparator_api_max_response_bytes", 1000, "api", {}),
    ("comparator_api_headers", {"X-Trace": "t"}, "api", {}),
    ("comparator_api_extra_body", {"store": False}, "api", {}),
    ("comparator_api_max_n_per_request", 2, "api", {}),
    ("comparator_api_response_field", "data.outputs", "api", {}),
    ("comparator_api_max_retries", 1, "api", {}),
    ("comparator_api_retry_backoff", 0.5, "api", {}),
    ("comparator_api_max_concurrency", 2, "api", {}),
]


@pytest.mark.parametrize("old, value, policy, others", ALIAS_CASES, ids=[c[0] for c in ALIAS_CASES])
def test_deprecated_comparator_field_moves_into_comparator_kwargs(tmp_path, old, value, policy, others):
    from trl_marl.trainers.preference.iterative_config import DEPRECATED_COMPARATOR_FIELDS

    key = DEPRECATED_COMPARATOR_FIELDS[old]
    if policy == "api" and key != "url":
        others = {"url": "http://127.0.0.1:1/x", **others}
    with pytest.warns(FutureWarning, match=rf"`{old}` is deprecated; set comparator_kwargs\['{key}'\]"):
        cfg = iter_args(tmp_path, comparator_policy=policy, comparator_kwargs=others or None, **{old: value})
    assert cfg.comparator_kwargs == {**others, key: value} and getattr(cfg, old) is None


def test_every_deprecated_comparator_field_has_its_case():
    from trl_marl.trainers.preference.iterative_config import DEPRECATED_COMPARATOR_FIELDS

    assert set(DEPRECATED_COMPARATOR_FIELDS) == {c[0] for c in ALIAS_CASES}


def test_a_comparator_option_given_both_ways_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"comparator_history_k and comparator_kwargs\['k'\] are both set"):
        iter_args(tmp_path, comparator_policy="history", comparator_history_k=2, comparator_kwargs={"k": 3})


def test_comparator_kwargs_from_the_command_line_and_as_an_options_dataclass(tmp_path):
    from trl import TrlParser

    from trl_marl.plugins.comparator_options import APIComparatorOptions

    argv = ["--output_dir", str(tmp_path), "--comparator_policy", "history", "--comparator_kwargs", '{"k": 2}']
    (cfg,) = TrlParser((MADPOIterConfig,)).parse_args_and_config(argv)
    assert cfg.comparator_kwargs == {"k": 2}
    options = APIComparatorOptions(url="http://127.0.0.1:1/x", format="codex", model="m")
    cfg = iter_args(tmp_path, comparator_policy="api", comparator_kwargs=options)
    assert cfg.comparator_kwargs["format"] == "openai_responses" and cfg.comparator_kwargs["url"] == options.url


def test_num_iterations_is_refused(tmp_path):
    """`num_iterations` was an alias of `num_rounds`; in TRL it is GRPO's policy updates per generation batch."""
    with pytest.raises(ValueError, match=r"num_iterations=5 is not an option.*set num_rounds.*GRPO loss family"):
        iter_args(tmp_path, num_iterations=5)
    with pytest.raises(ValueError, match="set num_rounds"):
        iter_args(tmp_path, cls=MARLHFIterConfig, num_iterations=2)


# ---------------------------------------------------------------- runs
def test_madpo_iter_rounds_files_and_records(tmp_path, small_items, tiny_path):
    replay = tmp_path / "replay"
    replay.mkdir()
    (replay / "iteration_0001.json").write_text('{"iteration": 1, "num_pairs": 1, "pairs": [{"stale": true}]}')
    args = iter_args(tmp_path, preference_replay_dir=str(replay), preference_replay_mode="all_history")
    t = MADPOIterTrainer(model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=small_items)
    t.train()
    assert t.rounds.completed == 2 and [r["iteration"] for r in t.rounds.stored] == [1, 2]
    first = read_round_file(str(replay / "iteration_0001.json"))
    assert first["iteration"] == 1 and first["num_pairs"] == len(first["pairs"])
    assert all("stale" not in p for p in first["pairs"])  # an earlier run's file is not imported
    rec = first["pairs"][0]
    assert set(rec) == {
        "prompts",
        "winner_completions",
        "loser_completions",
        "winner_reward",
        "loser_reward",
        "candidate_reward_mean",
        "raw_rewards",
        "target_raw_reward",
        "comparator_raw_reward",
        "winner_eos",
        "loser_eos",
    }
    assert rec["raw_rewards"][0] == rec["winner_reward"] and {
        rec["target_raw_reward"],
        rec["comparator_raw_reward"],
    } == set(rec["raw_rewards"])
    log = [h for h in t.state.log_history if "iter/current_iteration" in h]
    assert [h["iter/current_iteration"] for h in log] == [1.0, 2.0]


class ScriptedComparator(ModelComparator):
    """Centralized generation with scripted joint completions (one malformed)."""

    name = "scripted"

    def models(self, trainer):
        return [None, None], [None, None]

    def sample(self, trainer, models, tokenizers, prompts_per_agent, G):
        from trl_marl.data_types.rollout import GenerationOutput

        texts = []
        for _ in range(len(prompts_per_agent[0])):
            texts += ["<agent_1>x</agent_1><agent_2>y</agent_2>", "<agent_1>only one</agent_1>"][:G]
        return [GenerationOutput(texts, [], [])]


def test_centralized_comparator_parses_and_drops_malformed(tmp_path):
    comp = ScriptedComparator(iter_args(tmp_path), generation_mode="centralized")
    joint = comp.generate([{"prompt": "p"}], [["a"], ["b"]], 2, trainer=None)
    assert joint == [[["x", "y"], None]] and comp.parse_failures == 1


def test_history_comparator_reaches_back_k_rounds(tmp_path, small_items, tiny_path):
    args = iter_args(
        tmp_path, comparator_policy="history", comparator_kwargs={"k": 2}, num_rounds=3, learning_rate=5e-2
    )
    t = MADPOIterTrainer(model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=small_items)
    used = []
    original = t.rounds.comparator.prepare

    def spy(trainer, iteration):
        original(trainer, iteration)
        used.append((iteration, os.path.basename(t.rounds.comparator.loaded_from)))

    t.rounds.comparator.prepare = spy
    t.train()
    # round 1: initial; round 2: the oldest (initial) while fewer than 2 exist; round 3: the policy after round 1
    assert used == [(1, "iteration_0000"), (2, "iteration_0000"), (3, "iteration_0001")]
    w0 = load_file(os.path.join(t.rounds.policy_snapshots[0], "agent_1", "model.safetensors"))
    w1 = load_file(os.path.join(t.rounds.policy_snapshots[1], "agent_1", "model.safetensors"))
    assert any(not torch.equal(w0[k], w1[k]) for k in w0)  # snapshots differ: training happened in between


def test_model_comparator_loads_once(tmp_path, small_items, tiny_path, tiny_qwen_path, monkeypatch):
    import trl_marl.plugins.comparators as comparators

    loads = []
    original = comparators._load_causal_lm
    monkeypatch.setattr(comparators, "_load_causal_lm", lambda src, dev: loads.append(src) or original(src, dev))
    args = iter_args(tmp_path, comparator_policy="model", comparator_kwargs={"model_name": tiny_qwen_path})
    t = MADPOIterTrainer(model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=small_items)
    assert isinstance(t.rounds.comparator, FixedModelComparator)
    t.train()
    assert loads == [tiny_qwen_path]  # one id for both agents, loaded once for the whole run (two rounds)
    assert t.rounds.comparator._models is None  # released at the end
    assert t.rounds.completed == 2


def _fake_dist(tmp_path, monkeypatch, entry_points, module_name, source):
    root = tmp_path / uuid.uuid4().hex[:8]
    root.mkdir()
    (root / f"{module_name}.py").write_text(source)
    dist = root / f"acme_{module_name}-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: acme-{module_name}\nVersion: 0.1.0\n")
    lines = []
    for group, eps in entry_points.items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in eps.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(root))
    return module_name


PLUGIN = '''
from trl_marl.plugins.comparators import CurrentComparator


class EchoComparator:
    """Answers every prompt with a fixed short text per agent."""

    name = "echo"

    def __init__(self, args):
        self.n = args.num_agents
        self.calls = 0

    def generate(self, items, prompts_per_agent, num_candidates, trainer):
        self.calls += 1
        return [[[f"ok {i}" for i in range(self.n)] for _ in range(num_candidates)] for _ in items]


class NewestHalfReplay:
    name = "newest_half"

    def __init__(self, *, k=None, lam=None, sample_size=None):
        self.sample_size = sample_size

    def select(self, rounds, rng):
        current = rounds[-1]
        return [current[i] for i in range(len(current) // 2 + 1)] if len(current) else []
'''


def test_third_party_comparator_and_replay_mode_by_name(tmp_path, monkeypatch, small_items, tiny_path):
    module = _fake_dist(
        tmp_path,
        monkeypatch,
        {
            "trl_marl.comparators": {"echo": "acme_plugin_mod:EchoComparator"},
            "trl_marl.replay_modes": {"newest_half": "acme_plugin_mod:NewestHalfReplay"},
        },
        "acme_plugin_mod",
        PLUGIN,
    )
    try:
        args = iter_args(tmp_path, comparator_policy="echo", preference_replay_mode="newest_half")
        t = MADPOIterTrainer(model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=small_items)
        t.train()
        assert type(t.rounds.comparator).__name__ == "EchoComparator" and t.rounds.comparator.calls > 0
        pairs = read_round_file(t.rounds.stored[0]["path"])["pairs"]
        assert any("ok 0" in p["winner_completions"] + p["loser_completions"] for p in pairs)
        trained = [h["iter/train_preference_pairs"] for h in t.state.log_history if "iter/train_preference_pairs" in h]
        assert trained[0] == len(pairs) // 2 + 1
    finally:
        sys.modules.pop(module, None)


class _InvalidUnicodeComparator:
    """Answers with text holding a lone surrogate, as an API's JSON with a `"\\ud800"` escape decodes."""

    name = "invalid_unicode"

    def generate(self, items, prompts_per_agent, num_candidates, trainer):
        return [[[f"ok \ud800 {i} {k}" for i in range(2)] for k in range(num_candidates)] for _ in items]


def test_comparator_text_with_invalid_unicode_is_stored_and_replayed(tmp_path, small_items, tiny_path):
    # old code: TypeError (TextEncodeInput must be Union[...]) tokenizing the comparator's text, then, with that
    # fixed, UnicodeEncodeError ('utf-8' codec can't encode character '\ud800') writing the round file
    replay = tmp_path / "replay"
    args = iter_args(tmp_path, preference_replay_dir=str(replay), preference_replay_mode="all_history")
    t = MADPOIterTrainer(
        model=tiny_path,
        reward_funcs=letters_reward,
        args=args,
        train_dataset=small_items,
        comparator=_InvalidUnicodeComparator(),
    )
    replayed = []
    pair_from_record = t.pair_from_record
    t.pair_from_record = lambda record: replayed.append(pair_from_record(record)) or replayed[-1]
    t.train()
    assert t.rounds.completed == 2
    pairs = read_round_file(str(replay / "iteration_0001.json"))["pairs"]
    texts = [c for p in pairs for c in p["winner_completions"] + p["loser_completions"] if c.startswith("ok")]
    assert texts and all("\ufffd" in c and "\ud800" not in c for c in texts)
    # round 2 replays round 1 from its file: the comparator's completions get the ids they were trained on
    assert replayed
    for pair in replayed:
        for completions, ids in ((pair.winner_completions, pair.winner_ids), (pair.loser_completions, pair.loser_ids)):
            for i, (text, own_ids) in enumerate(zip(completions, ids)):
                if text.startswith("ok"):
                    original = text.replace("\ufffd", "\ud800")
                    assert own_ids.tolist() == t.tokenize_completion(i, original).tolist()


def _strict_json(path) -> object:
    """A JSON file as a strict parser reads it: UTF-8 without invalid bytes, and no string holding a lone surrogate
    (a `\\udXXX` escape that no pair completes, which e.g. orjson, serde_json and pyarrow refuse)."""
    from trl_marl.data_types.text import valid_texts

    data = json.loads(path.read_bytes().decode("utf-8", errors="strict"))
    assert valid_texts(data) == data, f"{path} holds a lone surrogate"
    return data


class _StatefulComparator(_InvalidUnicodeComparator):
    """Keeps its last answer in its state (a cache of an API's text, say)."""

    def __init__(self):
        self.last = None

    def generate(self, items, prompts_per_agent, num_candidates, trainer):
        out = super().generate(items, prompts_per_agent, num_candidates, trainer)
        self.last = out[0][0][0]
        return out

    def state_dict(self):
        return {"last": self.last}

    def load_state_dict(self, state):
        self.last = state["last"]


def test_checkpoint_state_files_are_strict_json_with_invalid_unicode_and_the_run_resumes(
    tmp_path, small_items, tiny_path, caplog
):
    """Audit: `iterative_state.json` wrote a replay folder's name that is not UTF-8 (a lone surrogate, as Python
    reads such a name) as a JSON `\\udcff` escape, which strict parsers refuse (old code: that escape). A round's
    path is a record only (the resume reads the checkpoint's copy), so it is written as U+FFFD; the comparator's
    text with lone surrogates never reaches the state files (round files hold it as U+FFFD, trainer_state.json
    numbers). A comparator's own state is what it resumes with: kept exactly, and warned of."""
    replay = tmp_path / "replay-\udcff"
    common = dict(save_strategy="steps", preference_replay_dir=str(replay), lr_scheduler_type="constant")
    t = MADPOIterTrainer(
        model=tiny_path,
        reward_funcs=letters_reward,
        args=iter_args(tmp_path, **common),
        train_dataset=small_items,
        comparator=_InvalidUnicodeComparator(),
    )
    t.train()
    out = tmp_path / "out"
    ckpt = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    state = _strict_json(ckpt / "iterative_state.json")
    assert [r["path"] for r in state["rounds"]] == [f"{tmp_path}/replay-\ufffd/iteration_000{k}.json" for k in (1, 2)]
    for path in [*out.rglob("*.json"), *replay.glob("*.json")]:  # trainer_state.json and the round files too
        _strict_json(path)

    resumed = MADPOIterTrainer(
        model=tiny_path,
        reward_funcs=letters_reward,
        args=iter_args(tmp_path, num_rounds=3, **common),
        train_dataset=small_items,
        comparator=_StatefulComparator(),
    )
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.rounds.completed == 3 and (replay / "iteration_0003.json").is_file()
    assert [r["path"] for r in resumed.rounds.stored] == [str(replay / f"iteration_000{k}.json") for k in (1, 2, 3)]

    folder = tmp_path / "state"
    with caplog.at_level("WARNING", logger="trl_marl.trainers.preference.rounds"):
        resumed.rounds.save_state(str(folder))
    assert "holds invalid unicode (a lone surrogate)" in caplog.text and "valid_texts" in caplog.text
    resumed.rounds.comparator.last = None
    resumed.rounds.load_state(str(folder))
    assert resumed.rounds.comparator.last == "ok \ud800 0 0"  # restored exactly: what it resumes with


# ---------------------------------------------------------------- API comparator end to end
class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen.append((dict(self.headers), body))
        n = body.get("num_return_sequences", 1)
        out = json.dumps({"completions": [f"api answer {body.get('agent_idx')}"] * n}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_api_comparator_in_a_run_never_writes_the_key(tmp_path, small_items, tiny_path, monkeypatch, caplog):
    secret = "sk-test-" + uuid.uuid4().hex
    monkeypatch.setenv("ACME_KEY", secret)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = iter_args(
            tmp_path,
            comparator_policy="api",
            num_rounds=1,
            save_strategy="steps",
            comparator_kwargs={"url": f"http://127.0.0.1:{server.server_address[1]}/generate", "key_env": "ACME_KEY"},
        )
        t = MADPOIterTrainer(model=tiny_path, reward_funcs=letters_reward, args=args, train_dataset=small_items)
        t.train()
        t.save_model(str(tmp_path / "saved"))
    finally:
        server.shutdown()
    headers, body = _Handler.seen[0]
    assert headers["Authorization"] == f"Bearer {secret}" and body["num_return_sequences"] == 3
    for root, _, files in os.walk(tmp_path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                data = fh.read()
            assert secret.encode() not in data, f
    assert secret not in caplog.text and secret not in repr(t.args)


# ---------------------------------------------------------------- resume
def _weights(t):
    return [p.detach().clone() for p in t.team.parameters()]


def test_kill_after_round_two_and_resume_gives_the_same_round_three(tmp_path, small_items, tiny_path):
    common = dict(lr_scheduler_type="constant", save_strategy="steps", comparator_policy="current")
    full = MADPOIterTrainer(
        model=tiny_path,
        reward_funcs=letters_reward,
        train_dataset=small_items,
        args=iter_args(tmp_path / "full", num_rounds=3, **common),
    )
    full.train()
    # the "killed" run stops after round 2 (its round-2 checkpoint is what a kill leaves behind)
    killed = MADPOIterTrainer(
        model=tiny_path,
        reward_funcs=letters_reward,
        train_dataset=small_items,
        args=iter_args(tmp_path / "killed", num_rounds=2, **common),
    )
    killed.train()
    ckpt = sorted((tmp_path / "killed" / "out").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    resumed = MADPOIterTrainer(
        model=tiny_path,
        reward_funcs=letters_reward,
        train_dataset=small_items,
        args=iter_args(tmp_path / "killed", num_rounds=3, **common),
    )
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.rounds.completed == 3
    a = read_round_file(str(tmp_path / "full" / "out" / "preference_replay" / "iteration_0003.json"))
    b = read_round_file(str(tmp_path / "killed" / "out" / "preference_replay" / "iteration_0003.json"))
    assert a == b
    for x, y in zip(_weights(full), _weights(resumed)):
        torch.testing.assert_close(x, y)


# ---------------------------------------------------------------- learning
def test_madpo_iter_improves_over_three_rounds(task_trainer):
    t, before = task_trainer(
        MADPOIterTrainer,
        MADPOIterConfig,
        "coordination",
        rollout_buffer_size=16,
        preference_num_candidates=4,
        train_batch_size=8,
        num_train_epochs=2,
        num_rounds=3,
    )
    t.train()
    after = t.state.log_history[-1]["eval_reward"]
    assert after > before + 0.1, (before, after)


def test_marlhf_iter_runs_rounds_with_fresh_reward_models(tmp_path, small_items, tiny_path):
    args = iter_args(
        tmp_path,
        cls=MARLHFIterConfig,
        num_generations=2,
        reward_learning_rate=1e-3,
        preference_scoring_reward="reward_model",
        train_batch_size=None,
    )
    t = MARLHFIterTrainer(
        model=tiny_path,
        reward_funcs=letters_reward,
        args=args,
        train_dataset=small_items,
        eval_dataset=small_items,
    )
    models = record_reward_models(t)
    t.train()
    assert len(models) == 2 and models[0] is not models[1]
    assert t.rounds.completed == 2 and t.state.global_step > 0
    assert "eval_reward" in t.state.log_history[-1]


def test_marlhf_iter_improves_over_three_rounds(task_trainer):
    """Three rounds of (pairs against the current policy -> a fresh joint reward model -> 3 RL epochs on its scores)
    raise the TASK reward on held-out prompts of `length_ratio` (fixed seed)."""
    t, before = task_trainer(
        MARLHFIterTrainer,
        MARLHFIterConfig,
        "length_ratio",
        preference_num_candidates=8,
        reward_learning_rate=1e-3,
        # 2 epochs: with TRL's RewardTrainer (different batch order, grad clipping) one epoch left this fixed-seed
        # run's reward model at 0.62 pair accuracy in round 1 and the gain at +0.05..+0.13 across variants
        reward_num_train_epochs=2,
        reward_max_length=40,
        num_rounds=3,
        num_train_epochs=3,
    )
    t.train()
    assert t.rounds.completed == 3
    after = t.state.log_history[-1]["eval_reward"]
    assert after > before + 0.1, (before, after)


@pytest.mark.parametrize("algorithm", ["maac", "iac"])
def test_marlhf_iter_with_actor_critic_backends(tmp_path, small_items, tiny_path, algorithm):
    args = iter_args(
        tmp_path,
        cls=MARLHFIterConfig,
        rl_algorithm=algorithm,
        num_generations=1,
        reward_learning_rate=1e-3,
        train_batch_size=None,
    )
    extra = {"critic_model": tiny_path} if algorithm == "maac" else {}
    t = MARLHFIterTrainer(
        model=tiny_path,
        reward_funcs=letters_reward,
        args=args,
        train_dataset=small_items,
        eval_dataset=small_items,
        **extra,
    )
    assert (
        type(t) is MARLHFIterTrainer and type(t.rl_step).__name__ == {"maac": "MAACStep", "iac": "IACStep"}[algorithm]
    )
    assert t.args.num_rounds == 2 and t.rl_step.normalize_advantages  # unset: on, the actor-critic default
    models = record_reward_models(t)
    critic = t.team.critics[0]
    before = [p.detach().clone() for p in critic.parameters()]
    t.train()
    assert t.rounds.completed == 2 and len(models) == 2 and models[0] is not models[1]  # a new reward model each round
    assert t.team.critics[0] is critic  # the critic carries over and keeps learning
    assert any(not torch.equal(a, b) for a, b in zip(before, critic.parameters()))
    assert "eval_reward" in t.state.log_history[-1]
    t.save_model(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / ("critic" if algorithm == "maac" else "critic_1")).is_dir()
    assert (tmp_path / "saved" / "reward_model" / "config.json").exists()
