"""A failure after the last optimizer step, in the evaluation that ends a run (docs/failures.md): a reward function
that raises in the final evaluation inside `train()` (MADPO's, MARLHF's `_after_training`), or in the evaluation
the training loop runs after its last step (`eval_strategy="steps"`). The training is complete: on one process the
checkpoint of the last step is written before the error is raised (also with `save_strategy="no"`) and named, and
a run resumed from it trains no further step."""

from __future__ import annotations

import pytest
import torch
from conftest import cpu_args, letters_reward
from transformers import TrainerCallback

from trl_marl.rewards import RewardFunctionError

ITEMS = [{"prompt": p} for p in ("the cat", "a dog", "sing", "rain")]


def _given_pairs(count: int = 4) -> list[dict]:
    """MADPO's preference data as given (one set of columns per agent): `count` pairs, 2 steps an epoch."""
    return [
        {
            "prompt_1": f"Write about topic {j}.",
            "chosen_1": f"good {j}",
            "rejected_1": f"bad {j}",
            "prompt_2": f"Edit about topic {j}.",
            "chosen_2": f"fine {j}",
            "rejected_2": f"poor {j}",
        }
        for j in range(count)
    ]


class _Reward:
    """The task reward, which raises once `broken` (set at the end of the last optimizer step by `breaker()`)."""

    def __init__(self):
        self.calls, self.broken, self.__name__ = 0, False, "scored_reward"

    def __call__(self, c1, c2):
        self.calls += 1
        if self.broken:
            raise TimeoutError("the reward API did not answer")
        return letters_reward(c1, c2)

    def breaker(self) -> TrainerCallback:
        reward = self

        class BreakAfterTheLastStep(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                reward.broken = reward.broken or state.global_step >= state.max_steps

        return BreakAfterTheLastStep()


def _build(family: str, out, reward: _Reward, callbacks=()):
    """3 optimizer steps of 2-step epochs (the run ends inside its second epoch), no periodic checkpoint, a constant
    learning rate (a step more would change the weights), an eval dataset."""
    from datasets import Dataset

    import trl_marl as tm

    common = dict(output_dir=str(out), max_steps=3, lr_scheduler_type="constant", eval_num_samples=2)
    kw = dict(model=_tiny(), reward_funcs=reward, eval_dataset=ITEMS, callbacks=list(callbacks))
    if family == "madpo":  # given pairs: the final evaluation is what calls the reward
        args = cpu_args(tm.MADPOConfig, out.parent, **common, train_batch_size=2, max_completion_length=8)
        return tm.MADPOTrainer(
            args=args, train_dataset=ITEMS, preference_pairs=Dataset.from_list(_given_pairs()), **kw
        )
    if family == "marlhf":  # collected pairs, a fitted reward model, the RL loop
        args = cpu_args(tm.MARLHFConfig, out.parent, **common, preference_num_candidates=2, reward_num_train_epochs=1)
        return tm.MARLHFTrainer(args=args, train_dataset=ITEMS, **kw)
    args = cpu_args(tm.MAGRPOConfig, out.parent, **common, eval_interval=2)  # evaluates at steps 2 and 3
    return tm.MAGRPOTrainer(args=args, train_dataset=ITEMS, **kw)


def _tiny() -> str:
    from trl_marl.testing import tiny_model_path

    return tiny_model_path()


def _weights(parameters) -> list[torch.Tensor]:
    return [p.detach().clone() for p in parameters]


def _fail_at_the_end_then_resume(family: str, tmp_path):
    """Train `family` with a reward that raises after the last step; check the named checkpoint holds the trained
    agents; resume from it with the reward fixed. Returns (the error's note, the resumed trainer and its output)."""
    from trl_marl import AgentTeam
    from trl_marl.checkpointing.checkpoint import checkpoint_status

    out = tmp_path / "run"
    reward = _Reward()
    run = _build(family, out, reward, [reward.breaker()])
    with pytest.raises(RewardFunctionError, match="reward function 'scored_reward' raised TimeoutError") as err:
        run.train()
    assert run.state.global_step == 3
    checkpoint = out / "checkpoint-3"
    assert checkpoint_status(str(checkpoint)) is None  # complete (save_strategy="no": written for the failure)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-3"]
    trained = _weights(run.team.parameters())
    saved = AgentTeam.from_pretrained(str(checkpoint))
    assert all(torch.equal(a, b) for a, b in zip(_weights(p for a in saved.agents for p in a.parameters()), trained))
    note = " ".join(err.value.__notes__)
    assert "the run's training is complete (step 3) but" in note and f": {checkpoint} holds the trained agents" in note
    assert f"AgentTeam.from_pretrained({str(checkpoint)!r}) loads them" in note and "fix the reward function" in note

    fixed = _Reward()
    resumed = _build(family, out, fixed)
    result = resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3  # no further step (transformers trained a 4th one: the epoch went on)
    assert all(torch.equal(a, b) for a, b in zip(_weights(resumed.team.parameters()), trained))
    return note, resumed, result, fixed


@pytest.mark.parametrize("family", ["madpo", "marlhf"])
def test_a_reward_that_raises_in_the_final_evaluation_checkpoints_the_trained_run_first(family, tmp_path):
    """MADPO (given pairs) and MARLHF (collected ones, an RL loop): the reward raises only in the final evaluation
    inside `train()`, after the last step. `checkpoint-3` is written first (save_strategy="no") with the trained
    weights and named; resuming from it trains no further step and only evaluates. On the old code nothing was saved:
    the whole trained run was lost, and the error named no checkpoint."""
    note, resumed, result, fixed = _fail_at_the_end_then_resume(family, tmp_path)
    assert "but its final evaluation failed" in note
    assert (
        "then resume with train(resume_from_checkpoint=True): it trains no further step and only runs the final "
        "evaluation again" in note
    )
    assert "eval_reward" in result.metrics and fixed.calls == 1  # the evaluation's one batch, nothing else


def test_a_reward_that_raises_in_the_evaluation_after_the_last_step_says_the_training_is_complete(tmp_path):
    """MAGRPO evaluating every 2 steps, 3 steps: the evaluation the loop runs after step 3 raises. The checkpoint was
    already written on the old code, but the error said "the run stopped after step 3 ... resume", and the resumed
    run trained a 4th step (transformers' loop checks `max_steps` after a step, and step 3 ended inside an epoch)."""
    note, resumed, result, fixed = _fail_at_the_end_then_resume("magrpo", tmp_path)
    assert "but the evaluation after its last step failed" in note
    assert (
        "then evaluate them with trainer.evaluate() (train(resume_from_checkpoint=True) trains no further step)"
        in (note)
    )
    assert fixed.calls == 0 and result.global_step == 3


def test_with_several_processes_a_failed_final_evaluation_says_the_training_is_complete(tmp_path):
    """Several processes (the others may be inside a collective of the evaluation and could not join a save): no
    checkpoint is written; the error says the training is complete and names the latest checkpoint, or none."""
    from types import SimpleNamespace

    from trl_marl.trainers.checkpoints import save_after_failure

    trainer = SimpleNamespace(
        args=SimpleNamespace(output_dir=str(tmp_path), gradient_accumulation_steps=1),
        state=SimpleNamespace(global_step=3, max_steps=3),
        accelerator=SimpleNamespace(num_processes=2),
        _step=3,
    )
    error = RewardFunctionError("f", 4, TimeoutError("the reward API did not answer"))
    save_after_failure(trainer, error, trained=True)
    assert list(tmp_path.iterdir()) == []
    assert error.__notes__ == [
        "trl_marl: the run's training is complete (step 3) but its final evaluation failed with no checkpoint to "
        "resume from; fix the reward function, then start it again"
    ]
