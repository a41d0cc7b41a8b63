"""trl_marl.distributed.collective in one process, with the all-reduce replaced by what another process would answer: a process
with less work makes the same number of generate / reward-model calls as the busiest one, with placeholders whose
results are discarded (the 2-process runs are in tests/test_distributed_uneven.py)."""

import pytest
import torch

import trl_marl.distributed.collective as collective
from trl_marl.data_types.rollout import GenerationOutput
from trl_marl.data_types.text import PromptText
from trl_marl.distributed.collective import even_chunks
from trl_marl.rewards import RewardFunction
from trl_marl.rollout.engine import JointRollout


def other_process_answers(monkeypatch, value: int):
    """`max_over_processes` as if another process held `value`."""
    monkeypatch.setattr(collective, "max_over_processes", lambda v: max(int(v), value))


def test_even_chunks_pads_with_empty_chunks_up_to_the_busiest_process(monkeypatch):
    assert even_chunks([1, 2, 3], 2, synced=False) == [[1, 2], [3]]
    assert even_chunks([1, 2, 3], 2) == [[1, 2], [3]]  # one process: nothing to agree on
    other_process_answers(monkeypatch, 4)
    assert even_chunks([1, 2, 3], 2) == [[1, 2], [3], [], []]
    assert even_chunks([], 2) == [[], [], [], []]
    assert even_chunks([1, 2, 3], 2, synced=False) == [[1, 2], [3]]
    with pytest.raises(ValueError, match="chunk size"):
        even_chunks([1], 0)


class Generate:
    def __init__(self):
        self.calls = []

    def __call__(self, prompts_per_agent, G, greedy=False):
        self.calls.append([len(p) for p in prompts_per_agent])
        return [
            GenerationOutput(
                [f"{i}|{p}" for p in ps for _ in range(G)],
                [torch.tensor([7])] * len(ps) * G,
                [torch.tensor([i])] * len(ps) * G,
            )
            for i, ps in enumerate(prompts_per_agent)
        ]


def make_rollout(synced: bool) -> tuple[JointRollout, list]:
    reward_calls = []

    def reward(c1, c2):
        reward_calls.append(len(c1))
        return [1.0] * len(c1)  # above the threshold: every branch ends after the first turn

    ro = JointRollout(
        num_agents=2,
        formatters=[lambda item: item["prompt"]] * 2,
        render=lambda i, x: PromptText(x),
        reward=RewardFunction(reward, 2),
        num_generations=1,
        num_turns=3,
        external_transition=lambda agent_completions: list(agent_completions),
        early_termination_threshold=0.0,
        synced=synced,
    )
    return ro, reward_calls


def test_a_synced_rollout_whose_branches_ended_runs_the_turns_another_process_still_runs(monkeypatch):
    items = [{"prompt": "a"}, {"prompt": "b"}]
    alone, alone_rewards = make_rollout(synced=False)
    gen_alone = Generate()
    expected = alone.run(items, gen_alone)
    assert gen_alone.calls == [[2, 2]]  # every branch ended after turn 1

    other_process_answers(monkeypatch, 1)  # another process still has branches in every turn
    synced, synced_rewards = make_rollout(synced=True)
    gen = Generate()
    got = synced.run(items, gen)
    assert gen.calls == [[2, 2], [0, 0], [0, 0]]  # turns 2 and 3 with no prompts (gathers only)
    assert synced_rewards == alone_rewards == [2]  # the (task) reward is not called with nothing to score
    # the same tree as one process alone
    assert [(n.item, n.turn, n.rewards.tolist()) for n in got.nodes] == [
        (n.item, n.turn, n.rewards.tolist()) for n in expected.nodes
    ]
    assert [s.completion for s in got.samples] == [s.completion for s in expected.samples]


def test_a_synced_process_without_items_takes_part_in_every_turn(monkeypatch):
    other_process_answers(monkeypatch, 1)
    ro, rewards = make_rollout(synced=True)
    gen = Generate()
    out = ro.run([], gen)
    assert gen.calls == [[0, 0]] * 3 and rewards == [] and out.nodes == []


def test_sharded_reward_model_scores_with_placeholder_forwards_up_to_the_busiest_process(monkeypatch, tiny_path):
    from trl_marl.trainers.preference.reward_model import JointRewardModel

    rm = JointRewardModel.from_pretrained(tiny_path, seed=0, max_length=32)
    texts, answers = [["topic", "x"]], [["answer", "yes"]]
    expected = rm.score(texts, answers, batch_size=1)
    forwards = []
    rm.model.register_forward_hook(lambda module, args, out: forwards.append(1))
    rm.collective = True  # as prepare_for_scoring sets it under ZeRO-3 / FSDP2 with several processes
    other_process_answers(monkeypatch, 3)  # another process scores 3 batches
    assert rm.score(texts, answers, batch_size=1) == expected
    assert len(forwards) == 3  # one real batch, two placeholders (discarded)
    assert rm.score([], [], batch_size=1) == [] and len(forwards) == 6


def test_generate_with_no_prompts_returns_empty_outputs(make_args, tiny_path):
    from trl_marl import MAGRPOConfig, MAGRPOTrainer

    t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=lambda a, b: [0.0] * len(a),
        args=make_args(MAGRPOConfig),
        train_dataset=[{"prompt": "p"}] * 4,
    )
    assert not t.collective_generation
    outs = t.generate([["hello"], []], 2)
    assert len(outs[0].texts) == 2 and outs[1].texts == [] and outs[1].completion_ids == []


EXIT_SCRIPT = """
import atexit, sys, tempfile
import torch.distributed as dist
from trl_marl.distributed.collective import destroy_process_group_at_exit

# registered first, so it runs last: what the interpreter's teardown would find
atexit.register(lambda: print("initialized at teardown:", dist.is_initialized(), flush=True))
store = dist.FileStore(tempfile.mktemp(), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
if sys.argv[1] == "vllm":  # a colocated vLLM engine's groups: vLLM's own shutdown destroys them
    import types
    sys.modules["vllm.distributed.parallel_state"] = types.SimpleNamespace(model_parallel_is_initialized=lambda: True)
if sys.argv[1] != "none":
    destroy_process_group_at_exit()
    destroy_process_group_at_exit()  # registered once
"""


@pytest.mark.parametrize("mode, destroyed", [("hook", True), ("none", False), ("vllm", False)])
def test_the_process_group_is_destroyed_before_the_interpreter_tears_down(tmp_path, mode, destroyed):
    """After `train()` the group is destroyed at exit, while the interpreter is whole (gloo's workers release their
    last work there: `test_gloo_workers_release_their_last_work_before_the_interpreter_finalizes`). Without the hook
    the group is still there at teardown (the control); with a colocated vLLM engine the hook leaves the groups to
    vLLM's shutdown, which fails on a group destroyed before it ("Invalid process group specified")."""
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == [f"initialized at teardown: {not destroyed}"]


RELEASE_SCRIPT = """
import sys, time
import torch, torch.distributed as dist
from trl_marl.distributed.collective import destroy_process_group_at_exit

rank, store_path, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
held = dist.group.WORLD  # as DeepSpeed's parameters and DDP's reducer hold it: destroying the group does not free it
tensors = [torch.ones(1) for _ in range(20000)]
if rank == 1:
    time.sleep(0.5)
    dist.all_reduce_coalesced(tensors)
else:
    # rank 0 stands for a process whose gloo worker was not scheduled between the last collective and the exit: its
    # main thread keeps the GIL (no switch for 100 s) while the worker, the work's last holder, releases the tensors
    sys.setswitchinterval(100.0)
    future = dist.all_reduce_coalesced(tensors, async_op=True)
    del tensors, future
    end = time.monotonic() + 3.0  # the peer joins after 0.5 s: the worker now waits for the GIL, tensor by tensor
    while time.monotonic() < end:
        pass
if mode == "hook":
    destroy_process_group_at_exit()
"""


@pytest.mark.parametrize("mode, aborts", [("hook", False), ("none", True)])
def test_gloo_workers_release_their_last_work_before_the_interpreter_finalizes(tmp_path, mode, aborts):
    """A gloo worker that releases a finished collective's tensors takes the GIL for each; one that asks for it after
    the interpreter started finalizing is ended by `pthread_exit` and aborts the process ("terminate called without
    an active exception", SIGABRT): CI's 2-process ZeRO-3 and DDP runs, after training finished, where DeepSpeed and
    DDP keep the group alive past `destroy_process_group`. The exit hook lets the workers run out first. The old
    hook (the group destroyed, nothing waited for) aborted here every time; so does no hook (the control)."""
    import subprocess
    import sys

    script, store = tmp_path / "release.py", tmp_path / "store"
    script.write_text(RELEASE_SCRIPT)
    peers = [
        subprocess.Popen([sys.executable, str(script), str(rank), str(store), mode], stderr=subprocess.PIPE, text=True)
        for rank in (1, 0)
    ]
    errors = [p.communicate(timeout=120)[1] for p in peers]
    codes = [p.returncode for p in peers]
    if aborts:
        assert codes[1] != 0 and "terminate called without an active exception" in errors[1], errors[1][-2000:]
    else:
        assert codes == [0, 0], errors[1][-2000:] + errors[0][-2000:]


def test_waiting_for_gloo_workers_costs_nothing_without_them():
    """A process without gloo workers (one process, NCCL) does not wait at exit."""
    import time

    start = time.monotonic()
    assert collective.wait_for_gloo_workers() is True
    assert time.monotonic() - start < 0.05
