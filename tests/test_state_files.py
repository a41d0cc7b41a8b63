"""Files read back by the trainers (round files, iterative state, critic folders, agent folders) are validated: a
damaged one gives an error naming the file, what is wrong and what to do."""

import json

import pytest

from trl_marl.checkpointing.state_files import CorruptedStateError
from trl_marl.trainers.preference.round_files import read_round_file, write_round_file


def _record(n=2):
    return {
        "prompts": ["p"] * n,
        "winner_completions": ["w"] * n,
        "loser_completions": ["l"] * n,
        "winner_reward": 1.0,
        "loser_reward": 0.0,
        "candidate_reward_mean": 0.5,
    }


@pytest.fixture
def round_file(tmp_path):
    path = tmp_path / "iteration_0002.json"
    write_round_file(str(path), 2, [_record(), _record()])
    return path


def test_truncated_round_file_is_named(round_file):
    text = round_file.read_text()
    round_file.write_text(text[: len(text) // 2])
    with pytest.raises(CorruptedStateError, match=r"iteration_0002.json: truncated .*; delete it and resume"):
        read_round_file(str(round_file))


def test_round_file_with_fewer_pairs_than_its_header_is_refused(round_file):
    data = json.loads(round_file.read_text())
    data["pairs"] = data["pairs"][:1]
    round_file.write_text(json.dumps(data))
    with pytest.raises(CorruptedStateError, match="its header says 2 pairs but it holds 1"):
        read_round_file(str(round_file))


def test_round_file_of_another_round_is_refused(round_file):
    with pytest.raises(CorruptedStateError, match="its header says round 2, expected round 3"):
        read_round_file(str(round_file), expected_iteration=3)


def test_round_file_pair_fields_are_checked(round_file):
    data = json.loads(round_file.read_text())
    del data["pairs"][1]["loser_reward"]
    round_file.write_text(json.dumps(data))
    with pytest.raises(CorruptedStateError, match=r"pair 1 lacks \['loser_reward'\]"):
        read_round_file(str(round_file))
    write_round_file(str(round_file), 2, [_record(3)])
    with pytest.raises(CorruptedStateError, match="pair 0's 'prompts' should list 2 entries"):
        read_round_file(str(round_file), num_agents=2)


@pytest.mark.parametrize(
    "change",
    [
        lambda pair: pair.update(winner_reward=1.5),  # a flipped digit: still a valid pair
        lambda pair: pair["winner_completions"].__setitem__(0, "W"),
        lambda pair: pair["prompts"].reverse() or pair["prompts"].__setitem__(0, "q"),
    ],
)
def test_round_file_changed_on_disk_into_a_valid_round_is_refused(round_file, change):
    data = json.loads(round_file.read_text())
    assert len(data["sha256"]) == 64
    change(data["pairs"][1])
    round_file.write_text(json.dumps(data))
    with pytest.raises(CorruptedStateError, match=r"iteration_0002.json: its pairs do not match the SHA-256"):
        read_round_file(str(round_file))


def test_round_file_checksum_survives_non_ascii_and_a_file_without_one_is_read(tmp_path):
    path = tmp_path / "iteration_0001.json"
    record = {
        **_record(),
        "winner_completions": ["d\u00e9j\u00e0 vu \U0001f600", "\u4f60\u597d"],
        "winner_reward": 0.1,
    }
    write_round_file(str(path), 1, [record])
    assert read_round_file(str(path))["pairs"] == [record]
    data = json.loads(path.read_text())
    del data["sha256"]  # a round written before checksums
    path.write_text(json.dumps(data))
    assert read_round_file(str(path))["pairs"] == [record]


def test_round_file_writes_invalid_unicode_as_replacement_characters_and_reads_back_as_written(tmp_path):
    # old code: UnicodeEncodeError ('utf-8' codec can't encode character '\ud800': surrogates not allowed) in
    # json.dump; no round file was written
    path = tmp_path / "iteration_0001.json"
    record = {**_record(), "prompts": ["p \udfff", "d\u00e9j\u00e0 \u4f60\u597d \U0001f600"]}
    record["loser_completions"] = ["x\ud800", "\ud83d\ude00 joined"]  # a lone surrogate; a pair of surrogates
    write_round_file(str(path), 1, [record])
    raw = path.read_bytes()
    assert "d\u00e9j\u00e0 \u4f60\u597d \U0001f600".encode() in raw  # valid text as it is (UTF-8, not escaped)
    pair = read_round_file(str(path))["pairs"][0]  # the checksum holds for what was written
    assert pair == {
        **record,
        "prompts": ["p \ufffd", "d\u00e9j\u00e0 \u4f60\u597d \U0001f600"],
        "loser_completions": ["x\ufffd", "\U0001f600 joined"],
    }
    assert record["loser_completions"][0] == "x\ud800"  # the caller's records are not changed
    # a checkpoint's copy is restored by reading and writing it again (RoundDriver.load_state): the same file
    again = tmp_path / "again" / "iteration_0001.json"
    write_round_file(str(again), 1, [pair])
    assert again.read_bytes() == raw


@pytest.fixture(scope="module")
def iterative_checkpoint(tmp_path_factory, tiny_path):
    """A real round-end checkpoint of a 1-round MADPOIter run (and the trainer that wrote it)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
    import resume_run

    out = tmp_path_factory.mktemp("iter")
    t = resume_run.build("madpoiter", str(out), tiny_path, num_rounds=1)
    t.train()
    (ckpt,) = out.glob("checkpoint-*")
    return t, ckpt


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda c: (c / "iterative_state.json").write_text('{"completed_rounds": 1, "rou'), "truncated"),
        (lambda c: (c / "iterative_state.json").write_text('{"completed_rounds": "one"}'), "should be a int"),
        (
            lambda c: (c / "preference_replay" / "iteration_0001.json").write_text(
                json.dumps({"iteration": 1, "num_pairs": 5, "pairs": []})
            ),
            "header says 5 pairs but it holds 0",
        ),
        (lambda c: (c / "preference_replay" / "iteration_0001.json").unlink(), "the file is missing"),
    ],
)
def test_damaged_iterative_checkpoint_is_named(iterative_checkpoint, tmp_path, damage, message):
    import shutil

    trainer, ckpt = iterative_checkpoint
    copy = tmp_path / ckpt.name
    shutil.copytree(ckpt, copy)
    damage(copy)
    with pytest.raises(CorruptedStateError, match=message) as err:
        trainer.rounds.load_state(str(copy))
    assert str(copy) in str(err.value) and f"delete {copy} and resume from the checkpoint before it" in str(err.value)


def test_missing_iterative_state_says_to_pick_another_checkpoint(iterative_checkpoint, tmp_path):
    trainer, _ = iterative_checkpoint
    with pytest.raises(
        CorruptedStateError, match="iterative_state.json: the file is missing.*resume_from_checkpoint=True"
    ):
        trainer.rounds.load_state(str(tmp_path))


def test_missing_agent_weights_in_a_checkpoint_are_named(iterative_checkpoint, tmp_path):
    import shutil

    trainer, ckpt = iterative_checkpoint
    copy = tmp_path / ckpt.name
    shutil.copytree(ckpt, copy)
    (copy / "agent_2" / "model.safetensors").unlink()
    with pytest.raises(CorruptedStateError, match=r"agent_2: no model weights .*delete .* and resume"):
        trainer._load_from_checkpoint(str(copy))


def test_iterative_resume_from_checkpoint_true(iterative_checkpoint, tiny_path):
    """`train(resume_from_checkpoint=True)` on an iterative trainer (was `TypeError: expected str ... not bool`)
    finds the latest complete checkpoint; every round being done, it ends at once with the same weights."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
    import resume_run

    done, ckpt = iterative_checkpoint
    t = resume_run.build("madpoiter", str(ckpt.parent), tiny_path, num_rounds=1)
    t.train(resume_from_checkpoint=True)
    assert t._restored_from == str(ckpt) and t.rounds.completed == 1
    assert t.state.global_step == done.state.global_step
    for a, b in zip(done.team.parameters(), t.team.parameters()):
        assert torch.equal(a, b)


def _team_json(**overrides):
    description = {
        "algorithm": "MAGRPO",
        "num_agents": 2,
        "agents": [{"folder": "agent_1", "role": "writer"}, {"folder": "agent_2", "role": "critic"}],
        "training_config": {"max_new_tokens": 8},
    }
    description.update(overrides)
    return json.dumps(description)


@pytest.mark.parametrize(
    "text,message",
    [
        (_team_json()[:40], r"team.json: truncated \(.*\); restore it"),
        ("{'num_agents': 2}", r"team.json: not valid JSON"),
        ("[1, 2]", "expected a JSON dict, found list"),
        (_team_json(num_agents=None).replace('"num_agents": null, ', ""), "the field 'num_agents' is missing"),
        (_team_json(agents="agent_1"), "the field 'agents' should be a list"),
        (_team_json(num_agents=3), "'num_agents' is 3 but 'agents' lists 2 entries"),
        (_team_json(agents=[{"folder": "agent_1"}, 7]), r"agents\[1\] should be an object"),
        (
            _team_json(agents=[{"folder": "agent_1"}, {"folder": "../../etc"}]),
            r"agents\[1\].folder should be a folder",
        ),
        (_team_json(training_config=[1]), "the field 'training_config' should be a dict"),
        (_team_json(hub={"layout": "per_agent", "agent_index": 5, "repo_ids": ["a/b", "a/c"]}), r"hub.agent_index"),
    ],
)
def test_damaged_team_json_is_named(tmp_path, text, message):
    """`AgentTeam.from_pretrained` (and the card / push code, all through `read_team_description`) refuses a damaged
    `team.json` with an error naming the file and what to do (was a bare `JSONDecodeError` / `KeyError` / `TypeError`,
    or a path outside the team folder)."""
    from trl_marl.hub import AgentTeam

    (tmp_path / "team.json").write_text(text)
    for i in (1, 2):
        (tmp_path / f"agent_{i}").mkdir()
    with pytest.raises(CorruptedStateError, match=message) as err:
        AgentTeam.from_pretrained(str(tmp_path))
    assert str(tmp_path / "team.json") in str(err.value) and "save the team again" in str(err.value)


def test_team_json_listing_missing_agent_folders_is_named(tmp_path):
    from trl_marl.hub import AgentTeam

    (tmp_path / "team.json").write_text(_team_json())
    (tmp_path / "agent_1").mkdir()
    with pytest.raises(CorruptedStateError, match=r"team.json: it lists agent folders that are missing .*'agent_2'"):
        AgentTeam.from_pretrained(str(tmp_path))
