"""Launched by tests/test_distributed.py under `accelerate launch`: trains a small team with MAGRPO, then with MADPO
(and with `all`, also MAAC, MARLHF and MADPOIter), in the same processes, and (main process) writes what the test
checks. Arguments: OUTPUT_DIR [hetero | all]."""

import json
import os
import sys

import torch

os.environ.setdefault("CI", "1")
torch.set_num_threads(1)
if os.environ.get("DIST_RUN_HANG_TIMEOUT"):  # debugging aid: dump every thread's stack if a rank hangs
    import faulthandler

    faulthandler.dump_traceback_later(int(os.environ["DIST_RUN_HANG_TIMEOUT"]), exit=True)


def reward(c1, c2):
    return [float(sum(ch in "aeiou" for ch in a) - sum(ch in "aeiou" for ch in b)) for a, b in zip(c1, c2)]


ALL = ("magrpo", "madpo", "maac", "iac", "mappo", "marlhf", "madpoiter", "marlhfiter")


def main():
    out = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    if mode.startswith("only="):  # a comma-separated list of trainers
        trainers, mode = tuple(mode[len("only=") :].split(",")), ""
    else:
        trainers = ALL if mode == "all" else ("magrpo", "madpo")
    for which in trainers:
        run(which, os.path.join(out, which), mode == "hetero")
    # destroy the process group before exit (as recipes do): a gloo group left to interpreter shutdown can abort a
    # rank with "terminate called without an active exception" after all the work is done
    from accelerate import PartialState

    PartialState().wait_for_everyone()
    PartialState().destroy_process_group()


def run(which, out, hetero):
    from datasets import Dataset

    from trl_marl import (
        IACConfig,
        IACTrainer,
        MAACConfig,
        MAACTrainer,
        MADPOConfig,
        MADPOIterConfig,
        MADPOIterTrainer,
        MADPOTrainer,
        MAGRPOConfig,
        MAGRPOTrainer,
        MAPPOConfig,
        MAPPOTrainer,
        MARLHFConfig,
        MARLHFIterConfig,
        MARLHFIterTrainer,
        MARLHFTrainer,
    )
    from trl_marl.testing import tiny_model_path

    items = Dataset.from_list(
        [
            {"prompt": f"Item {i}: say something about {w}."}
            for i, w in enumerate(["rain", "snow", "wind", "fire", "stone", "gold", "sea", "sky"])
        ]
    )
    common = dict(
        output_dir=out,
        max_new_tokens=6,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        eval_num_samples=4,
    )
    team = {"agent_model": tiny_model_path()}
    if hetero:
        from transformers import AutoTokenizer

        paths = [tiny_model_path(), tiny_model_path(architecture="qwen2", num_key_value_heads=2, seed=1)]
        team = {"agents": paths, "tokenizer": [AutoTokenizer.from_pretrained(p) for p in paths]}
    if which == "magrpo":
        args = MAGRPOConfig(
            num_generations=3, rollout_buffer_size=2, max_steps=2, trace_dir=os.path.join(out, "trace"), **common
        )
        trainer = MAGRPOTrainer(reward_func=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "madpo":
        args = MADPOConfig(
            preference_num_candidates=3, rollout_buffer_size=2, train_batch_size=2, max_steps=2, **common
        )
        trainer = MADPOTrainer(reward_func=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "maac":
        args = MAACConfig(rollout_buffer_size=2, max_steps=2, **common)
        trainer = MAACTrainer(
            reward_func=reward,
            args=args,
            train_dataset=items,
            eval_dataset=items,
            critic_model=tiny_model_path(),
            **team,
        )
    elif which == "iac":
        args = IACConfig(rollout_buffer_size=2, max_steps=2, **common)
        trainer = IACTrainer(reward_func=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "mappo":
        args = MAPPOConfig(rollout_buffer_size=2, train_batch_size=1, ppo_epochs=1, max_steps=2, **common)
        trainer = MAPPOTrainer(
            reward_func=reward,
            args=args,
            train_dataset=items,
            eval_dataset=items,
            critic_model=tiny_model_path(),
            **team,
        )
    elif which == "marlhfiter":
        args = MARLHFIterConfig(
            preference_num_candidates=3,
            num_generations=2,
            rollout_buffer_size=2,
            num_iterations=2,
            reward_learning_rate=1e-3,
            **common,
        )
        trainer = MARLHFIterTrainer(reward_func=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "marlhf":
        args = MARLHFConfig(
            preference_num_candidates=3,
            num_generations=2,
            rollout_buffer_size=2,
            max_steps=2,
            reward_learning_rate=1e-3,
            **common,
        )
        trainer = MARLHFTrainer(reward_func=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "madpoiter":
        args = MADPOIterConfig(
            preference_num_candidates=3, rollout_buffer_size=2, train_batch_size=2, num_iterations=2, **common
        )
        trainer = MADPOIterTrainer(reward_func=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    trainer.train()
    if os.environ.get("DIST_RUN_DEBUG"):
        a = trainer.accelerator
        sd = a.get_state_dict(trainer.model)
        print("DEBUG", a.is_fsdp2, a.distributed_type, a.state.fsdp_plugin, {type(v).__name__ for v in sd.values()}, flush=True)
    metrics = trainer.evaluate_reward()
    trainer.save_model(out)
    # the full weights as the engine holds them (gathered under ZeRO-3), to compare with what was saved
    if trainer.is_deepspeed_enabled:
        state = trainer.accelerator.get_state_dict(trainer.deepspeed)
    elif trainer.is_fsdp_enabled:
        state = trainer.accelerator.get_state_dict(trainer.model)
    else:
        state = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    acc = trainer.accelerator
    if acc.is_main_process:
        torch.save({k: v.detach().cpu().float() for k, v in state.items()}, os.path.join(out, "gathered.pt"))
        info = {
            "num_processes": acc.num_processes,
            "distributed_type": str(acc.distributed_type),
            "global_step": trainer.state.global_step,
            "completed_rounds": getattr(trainer, "completed_rounds", None),
            "eval_reward": metrics["eval_reward"],
            "env_step": trainer.state.log_history[0].get("env_step"),
            "num_pairs": len(getattr(trainer, "pairs", None) or []),
        }
        with open(os.path.join(out, "run_info.json"), "w") as f:
            json.dump(info, f)


if __name__ == "__main__":
    main()
