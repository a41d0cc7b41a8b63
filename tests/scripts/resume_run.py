"""Kill-and-resume harness of tests/test_resume.py: builds a small trainer of one family and trains it.

Run as a script: `resume_run.py FAMILY OUTPUT_DIR TINY_MODEL [--kill-at K] [--signal-at K]`:
  --kill-at K    SIGKILL this process at the end of optimizer step K (no polite stop, no checkpoint of step K);
  --signal-at K  send this process SIGTERM at the end of step K (the preemption path);
  --signal-in P  send this process SIGTERM when phase P before the training loop starts: `collection` (the
                 preference pairs of MADPO / MARLHF) or `reward_fit` (MARLHF's reward model); the phase then runs on;
  --no-save      no periodic checkpoints (save_strategy="no");
  --resume       resume from the latest complete checkpoint (the multi-process test).
The test imports `build` to run the uninterrupted and the resumed runs in its own process.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

os.environ.setdefault("CI", "1")
torch.set_num_threads(1)

FAMILIES = (
    "magrpo",
    "magrpo_trl",
    "maac",
    "iac",
    "mappo",
    "madpo",
    "marlhf",
    "marlhf_maac",
    "madpoiter",
    "marlhfiter",
)
MAX_STEPS = {"magrpo": 6, "magrpo_trl": 6, "maac": 6, "iac": 6, "mappo": 6, "madpo": 6, "marlhf": 6}


def reward(c1, c2):
    return [float(sum(ch in "aeiou" for ch in a) - 0.5 * sum(ch in "aeiou" for ch in b)) for a, b in zip(c1, c2)]


def items():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": f"Write about topic {i}."} for i in range(8)])


def build(family: str, output_dir: str, tiny: str, callbacks=None, save: bool = True, num_rounds: int = 3):
    """The trainer of `family`: 2 agents, a linear (non-constant) learning-rate schedule, a checkpoint every step
    (every round for the iterative trainers: `num_rounds` of them), steps that take more than one slice of each
    rollout."""
    from transformers import set_seed

    import trl_marl as tm

    # value heads and reward-model heads are initialised when the trainer is built (before Trainer seeds anything):
    # as transformers says of randomly initialised parts, seed before building
    set_seed(3)
    common = dict(
        output_dir=output_dir,
        num_agents=2,
        num_generations=2,
        max_completion_length=5,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        logging_steps=1,
        save_strategy="steps" if save else "no",
        save_steps=1,
        report_to="none",
        disable_tqdm=True,
        seed=3,
    )
    rl = dict(rollout_buffer_size=4, train_batch_size=2, max_steps=MAX_STEPS.get(family, -1))
    kw = dict(model=tiny, reward_funcs=reward, train_dataset=items(), callbacks=callbacks)
    if family == "magrpo":
        return tm.MAGRPOTrainer(args=tm.MAGRPOConfig(**common, **rl), **kw)
    if family == "magrpo_trl":  # TRL's loss: each generation's old / reference log-probs in the resume state
        trl = dict(loss_type="dapo", beta=0.04, num_iterations=2)
        return tm.MAGRPOTrainer(args=tm.MAGRPOConfig(**common, **rl, **trl), **kw)
    if family == "maac":
        return tm.MAACTrainer(critic_model=tiny, args=tm.MAACConfig(**common, **rl), **kw)
    if family == "iac":
        return tm.IACTrainer(args=tm.IACConfig(**common, **rl), **kw)
    if family == "mappo":
        cfg = tm.MAPPOConfig(**common, **rl, ppo_epochs=1, value_normalization=True)
        return tm.MAPPOTrainer(critic_model=tiny, args=cfg, **kw)
    pref = dict(rollout_buffer_size=4, preference_num_candidates=2, train_batch_size=2)
    madpo = {k: v for k, v in common.items() if k != "num_generations"}  # MADPO refuses it (preference_num_candidates)
    if family == "madpo":
        return tm.MADPOTrainer(args=tm.MADPOConfig(**madpo, **pref, max_steps=6), **kw)
    if family == "marlhf":
        cfg = tm.MARLHFConfig(**common, **pref, max_steps=6, reward_num_train_epochs=1)
        cfg.rollout_buffer_size, cfg.train_batch_size = 4, 2
        return tm.MARLHFTrainer(args=cfg, **kw)
    if family == "marlhf_maac":  # the MAAC backend: its critic folder and frozen critic data in the checkpoint
        cfg = tm.MARLHFConfig(**common, **pref, max_steps=6, reward_num_train_epochs=1, rl_algorithm="maac")
        return tm.MARLHFTrainer(args=cfg, critic_model=tiny, **kw)
    if family == "madpoiter":
        return tm.MADPOIterTrainer(args=tm.MADPOIterConfig(**madpo, **pref, num_rounds=num_rounds), **kw)
    if family == "marlhfiter":
        cfg = tm.MARLHFIterConfig(**common, **pref, num_rounds=num_rounds, reward_num_train_epochs=1)
        return tm.MARLHFIterTrainer(args=cfg, **kw)
    raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")


def main() -> None:
    from transformers import TrainerCallback

    family, out, tiny = sys.argv[1:4]
    rest = sys.argv[4:]
    kill_at = int(rest[rest.index("--kill-at") + 1]) if "--kill-at" in rest else None
    signal_at = int(rest[rest.index("--signal-at") + 1]) if "--signal-at" in rest else None

    class Die(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if state.global_step == signal_at:
                os.kill(os.getpid(), signal.SIGTERM)  # handled: the trainer finishes this step and checkpoints

    trainer = build(family, out, tiny, callbacks=[Die()], save="--no-save" not in rest)
    if "--signal-in" in rest:
        phase = {"collection": "collect_preference_pairs", "reward_fit": "fit_reward_model"}[
            rest[rest.index("--signal-in") + 1]
        ]
        run_phase = getattr(trainer, phase)

        def signalled(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)  # handled: the phase runs to its end, then the trainer checkpoints
            return run_phase(*args, **kwargs)

        setattr(trainer, phase, signalled)
    trainer.train(resume_from_checkpoint=True if "--resume" in rest else None)
    if trainer.accelerator.num_processes > 1:
        trainer.accelerator.wait_for_everyone()
        trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
