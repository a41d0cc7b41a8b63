"""Launched by tests/test_distributed.py under `accelerate launch`: trains a small team with MAGRPO, then with MADPO
(and with `all`, also MAAC, MARLHF and MADPOIter), in the same processes, and (main process) writes what the test
checks. Arguments: OUTPUT_DIR [hetero | all]."""

import faulthandler
import json
import os
import sys

import torch

os.environ.setdefault("CI", "1")
torch.set_num_threads(1)
# a rank that aborts (SIGABRT from a C++ terminate) prints every thread's Python stack into the test's failure output
faulthandler.enable(all_threads=True)
if os.environ.get("DIST_RUN_HANG_TIMEOUT"):  # debugging aid: dump every thread's stack if a rank hangs
    faulthandler.dump_traceback_later(int(os.environ["DIST_RUN_HANG_TIMEOUT"]), exit=True)


def reward(c1, c2):
    return [float(sum(ch in "aeiou" for ch in a) - sum(ch in "aeiou" for ch in b)) for a, b in zip(c1, c2)]


ALL = ("magrpo", "madpo", "maac", "iac", "mappo", "marlhf", "madpoiter", "marlhfiter")


def main():
    out = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    if mode.split("=")[0] == "equiv":  # `equiv` or `equiv=madpo,mappo`
        # the same global batches as one process would see, with prompt-seeded sampling: weights comparable with a
        # single-process run (`python dist_run.py OUT equiv`)
        for which in mode.split("=")[1].split(",") if "=" in mode else EQUIV:
            run_equiv(which, os.path.join(out, which))
        _finish()
        return
    if mode.split("=")[0] == "rss":  # `rss`, or `rss=kl,steps=2` (reference KL on; two steps)
        opts = mode.split("=", 1)[1].split(",") if "=" in mode else []
        steps = next((int(o.split("=")[1]) for o in opts if o.startswith("steps=")), 3)
        run_rss(out, reference_kl="kl" in opts, max_steps=steps)
        _finish()
        return
    if mode == "uneven":  # ranks with uneven work under ZeRO-3 / FSDP2 (tests/test_distributed_uneven.py)
        run_uneven(out)
        _finish()
        return
    if mode == "refprecompute":  # MADPO's reference precompute split over the ranks (test_distributed_uneven.py)
        run_ref_precompute(out)
        _finish()
        return
    if mode.startswith("only="):  # a comma-separated list of trainers
        trainers, mode = tuple(mode[len("only=") :].split(",")), ""
    else:
        trainers = ALL if mode == "all" else ("magrpo", "madpo")
    for which in trainers:
        run(which, os.path.join(out, which), mode == "hetero")
    _finish()


def _finish():
    # destroy the process group before exit (as recipes do): a gloo group left to interpreter shutdown can abort a
    # rank with "terminate called without an active exception" after all the work is done
    from accelerate import PartialState

    if PartialState().use_distributed:
        PartialState().wait_for_everyone()
        PartialState().destroy_process_group()


EQUIV = ("magrpo", "mappo", "madpo", "magrpo_lora")


def run_equiv(which, out):
    from datasets import Dataset
    from peft import LoraConfig

    from trl_marl import MADPOConfig, MADPOTrainer, MAGRPOConfig, MAGRPOTrainer, MAPPOConfig, MAPPOTrainer
    from trl_marl.testing import prompt_seeded_generation, tiny_model_path

    world = int(os.environ.get("WORLD_SIZE", "1"))
    per = 4 // world  # 4 items per rollout in all, split over the processes
    items = Dataset.from_list([{"prompt": f"Item {i}: say something about {w}."} for i, w in enumerate(WORDS)])
    common = dict(
        output_dir=out,
        max_completion_length=6,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        max_steps=2,
        rollout_buffer_size=per,
        train_batch_size=per,
        # one process clips each agent by its own norm; DeepSpeed clips all gradients together: compare the
        # sharding, not the clipping policy
        max_grad_norm=0.0,
    )
    team = {"model": tiny_model_path(), "reward_funcs": reward, "train_dataset": items}
    torch.manual_seed(0)  # the random initial weights (LoRA, value heads) as in the single-process run
    if which == "magrpo":
        trainer = MAGRPOTrainer(args=MAGRPOConfig(num_generations=3, reference_kl_enabled=True, **common), **team)
    elif which == "magrpo_lora":
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        args = MAGRPOConfig(num_generations=3, share_base_model=True, **common)
        trainer = MAGRPOTrainer(args=args, peft_config=lora, **team)
    elif which == "mappo":
        # advantage_normalization (on by default) z-scores over the GLOBAL batch: each process its share of it
        args = MAPPOConfig(ppo_epochs=1, **common)
        trainer = MAPPOTrainer(args=args, critic_model=tiny_model_path(), **team)
    elif which == "madpo":
        # pairs collected from 9 items, 2 per process per generate: chunks of 4, 4 and 1 item, so rank 1 rolls out
        # a filler in the last (generation is a collective under ZeRO-3 / FSDP2); then 4 pairs per step (2 per
        # process). Random pair selection: the choice must not depend on the process
        args = MADPOConfig(
            preference_num_candidates=3, pair_selection="random", preference_pairs_per_sample=2, **common
        )
        nine = Dataset.from_list([*items, {"prompt": "Item 8: say something about moon."}])
        trainer = MADPOTrainer(args=args, **{**team, "train_dataset": nine})
    gathered = record_gathers(trainer)
    # each prompt's samples depend only on the weights, the prompt and the step: a 2-process run, whose ranks each
    # roll out a share of the items, samples exactly what one process rolling out every item samples
    prompt_seeded_generation(trainer)
    trainer.train()
    trainer.save_model(out)
    if trainer.accelerator.is_main_process:
        with open(os.path.join(out, "run_info.json"), "w") as f:
            json.dump({"num_processes": trainer.accelerator.num_processes, **gathered}, f)
        if which == "madpo":  # the collected pairs, in the order they are trained on
            with open(os.path.join(out, "pairs.json"), "w") as f:
                json.dump([p.to_record() for p in trainer.pairs], f)


def run_rss(out, reference_kl=False, max_steps=3):
    """A model-shaped team (2 agents, hidden 512, 8 layers): `max_steps` MAGRPO steps; each rank writes its RSS
    before the trainer is built, its peak RSS, its current and peak RSS at the end of each phase (built, prepared,
    rollout, step), the time of each training step, the engine's ZeRO settings, and `trl_marl.distributed.memory.estimate` of
    this very run (its args, engine, number of processes and longest prompt)."""
    import resource
    import time

    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_marl import MAGRPOConfig, MAGRPOTrainer
    from trl_marl.testing import tiny_model_path

    path = tiny_model_path(hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8)
    items = Dataset.from_list([{"prompt": f"Item {i}: say something about {w}."} for i, w in enumerate(WORDS)])
    args = MAGRPOConfig(
        output_dir=out,
        num_generations=2,
        rollout_buffer_size=2,
        max_completion_length=16,
        max_steps=max_steps,
        seed=0,
        learning_rate=1e-3,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        reference_kl_enabled=reference_kl,
    )

    def status() -> dict[str, int]:
        with open("/proc/self/status") as f:
            return {
                k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "VmHWM")
            }

    before = status()["VmRSS"]
    steps, phases = [], []

    def phase(name: str) -> None:  # current and peak RSS at the end of each phase
        phases.append((name, *status().values()))

    class Timer(TrainerCallback):
        def on_train_begin(self, *a, **k):
            phase("prepared")

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            steps.append(time.perf_counter() - self.t0)
            phase("step")

    trainer = MAGRPOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=items, callbacks=[Timer()])
    built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak while loading and building
    phase("built")
    rollout_step = trainer._rollout_step

    def timed_rollout(items):
        out = rollout_step(items)
        phase("rollout")
        return out

    trainer._rollout_step = timed_rollout
    trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rank = trainer.accelerator.process_index
    from trl_marl.distributed.memory import estimate

    if trainer.is_deepspeed_enabled:
        engine = f"zero{trainer.accelerator.state.deepspeed_plugin.zero_stage}"
    else:
        engine = "fsdp2" if trainer.is_fsdp_enabled else "ddp"
    prompt_length = max(len(trainer.tokenize_prompt(0, item["prompt"])) for item in items)
    flag = engine == "zero3" and trainer.accelerator.state.deepspeed_plugin.zero3_init_flag
    world = trainer.accelerator.num_processes
    est = estimate(args, path, engine, world, prompt_length=prompt_length, zero3_init_flag=flag)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rss_rank{rank}.json"), "w") as f:
        json.dump(
            {
                "before": before,
                "built": built,
                "peak": peak,
                "steps": steps,
                "timings": dict(trainer._metrics.timings),
                "phases": phases,
                "zero_optimization": zero_config(trainer),
                "engine": engine,
                "estimate": est.as_dict(),
            },
            f,
        )


def zero_config(trainer) -> dict:
    """The DeepSpeed engine's ZeRO settings (empty without DeepSpeed)."""
    if not trainer.is_deepspeed_enabled:
        return {}
    zero = trainer.deepspeed._config.zero_config
    keys = ("reduce_bucket_size", "prefetch_bucket_size", "max_live_parameters", "max_reuse_distance")
    return {k: int(getattr(zero, k)) for k in keys}


def record_gathers(trainer):
    """Under FSDP2, record which agents hold full (non-DTensor) parameters while each agent generates, and how
    the team is cut into FSDP units."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    import trl_marl.generation.hf as hf

    info = {"generating": [], "units_per_agent": []}
    if not trainer.is_fsdp_enabled:
        return info
    team = trainer.team
    backbones = [team.shared] if team.shared_base else list(team.agents)
    info["units_per_agent"] = [sum(isinstance(m, FSDPModule) for m in b.modules()) for b in backbones]
    info["sharded_at_start"] = all(isinstance(p, DTensor) for p in team.parameters())
    original = hf.__dict__.setdefault("_unpatched_gather", hf.gathered_for_generation)

    class Recording:
        def __init__(self, module, root):
            self.ctx = original(module, root)

        def __enter__(self):
            m = self.ctx.__enter__()
            full = [not any(isinstance(p, DTensor) for p in b.parameters()) for b in backbones]
            info["generating"].append(full)
            return m

        def __exit__(self, *exc):
            return self.ctx.__exit__(*exc)

    hf.gathered_for_generation = Recording
    return info


WORDS = ["rain", "snow", "wind", "fire", "stone", "gold", "sea", "sky"]


def record_reward_model_shards(trainer, out):
    """Record, at every scoring call of the joint reward model during RL, what this rank holds of it
    (`shard_probe.shard_numel`), into OUT/reward_model_shards_rank{r}.json."""
    from shard_probe import shard_numel

    from trl_marl.trainers.preference.reward_model import JointRewardModel

    records = []
    score = JointRewardModel.score

    def probed(self, *args, **kwargs):
        records.append(shard_numel(self.hf_model))
        return score(self, *args, **kwargs)

    JointRewardModel.score = probed
    original_train = trainer.train

    def train(*args, **kwargs):
        try:
            return original_train(*args, **kwargs)
        finally:
            JointRewardModel.score = score
            os.makedirs(out, exist_ok=True)
            rank = trainer.accelerator.process_index
            with open(os.path.join(out, f"reward_model_shards_rank{rank}.json"), "w") as f:
                json.dump(records, f)

    trainer.train = train


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
        max_completion_length=6,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        eval_num_samples=4,
    )
    team = {"model": tiny_model_path()}
    if hetero:
        from transformers import AutoTokenizer

        paths = [tiny_model_path(), tiny_model_path(architecture="qwen2", num_key_value_heads=2, seed=1)]
        team = {"model": paths, "processing_class": [AutoTokenizer.from_pretrained(p) for p in paths]}
    if which == "magrpo":
        args = MAGRPOConfig(
            num_generations=3, rollout_buffer_size=2, max_steps=2, trace_dir=os.path.join(out, "trace"), **common
        )
        trainer = MAGRPOTrainer(reward_funcs=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "madpo":
        args = MADPOConfig(
            preference_num_candidates=3, rollout_buffer_size=2, train_batch_size=2, max_steps=2, **common
        )
        trainer = MADPOTrainer(reward_funcs=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "maac":
        args = MAACConfig(rollout_buffer_size=2, max_steps=2, **common)
        trainer = MAACTrainer(
            reward_funcs=reward,
            args=args,
            train_dataset=items,
            eval_dataset=items,
            critic_model=tiny_model_path(),
            **team,
        )
    elif which == "iac":
        args = IACConfig(rollout_buffer_size=2, max_steps=2, **common)
        trainer = IACTrainer(reward_funcs=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "mappo":
        args = MAPPOConfig(rollout_buffer_size=2, train_batch_size=1, ppo_epochs=1, max_steps=2, **common)
        trainer = MAPPOTrainer(
            reward_funcs=reward,
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
            num_rounds=2,
            reward_learning_rate=1e-3,
            **common,
        )
        trainer = MARLHFIterTrainer(reward_funcs=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "marlhf":
        args = MARLHFConfig(
            preference_num_candidates=3,
            num_generations=2,
            rollout_buffer_size=2,
            max_steps=2,
            reward_learning_rate=1e-3,
            **common,
        )
        trainer = MARLHFTrainer(reward_funcs=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    elif which == "madpoiter":
        args = MADPOIterConfig(
            preference_num_candidates=3, rollout_buffer_size=2, train_batch_size=2, num_rounds=2, **common
        )
        trainer = MADPOIterTrainer(reward_funcs=reward, args=args, train_dataset=items, eval_dataset=items, **team)
    if which in ("marlhf", "marlhfiter"):
        record_reward_model_shards(trainer, out)
    trainer.train()
    if os.environ.get("DIST_RUN_DEBUG"):
        a = trainer.accelerator
        sd = a.get_state_dict(trainer.model)
        print(
            "DEBUG",
            a.is_fsdp2,
            a.distributed_type,
            a.state.fsdp_plugin,
            {type(v).__name__ for v in sd.values()},
            flush=True,
        )
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
            "completed_rounds": trainer.rounds.completed if getattr(trainer, "rounds", None) else None,
            "eval_reward": metrics["eval_reward"],
            "env_step": trainer.state.log_history[0].get("env_step"),
            "num_pairs": len(getattr(trainer, "pairs", None) or []),
        }
        with open(os.path.join(out, "run_info.json"), "w") as f:
            json.dump(info, f)


def _plain_loading(trainer):
    """Load models in full on this rank (outside `deepspeed.zero.Init` under ZeRO-3 with `zero3_init_flag`)."""
    from trl_marl.distributed.zero3 import loaded_in_full

    return loaded_in_full(getattr(trainer.accelerator.state, "deepspeed_plugin", None))


def run_uneven(out):
    """Ranks with uneven work (tests/test_distributed_uneven.py): under ZeRO-3 / FSDP2 generation and the forwards
    of the joint reward model and the critics are collectives, so the old code hung here. Each rank writes
    OUT/rank{r}.json (and .pt) with what it computed and what one process alone computes from the same weights.

    1. `generate` with prompts on rank 0 and none on rank 1 (greedy), vs a full local copy of the agents.
    2. (FSDP2) `trl_marl.distributed.fsdp.full_state_dict` of agent 1: on every rank / on rank 0 only.
    3. A sharded joint reward model scores 3 texts in 3 batches on rank 0, 1 text on rank 1, vs a full local copy.
    4. One MAAC step (separate critic), 2 turns: every branch of rank 0 terminates after turn 1 (its reward is
       above `early_termination_threshold`), rank 1's run both turns.
    5. Evaluation on 3 items, one per batch: 2 batches on rank 0, 1 on rank 1.
    """
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from trl_marl import MAACConfig, MAACTrainer
    from trl_marl.distributed.fsdp import full_state_dict, is_fsdp2
    from trl_marl.testing import tiny_model_path
    from trl_marl.trainers.preference.reward_model import JointRewardModel

    rank = int(os.environ.get("RANK", "0"))  # the launcher's (the rank reward functions below depend on it)
    tiny = tiny_model_path()
    words = ["rain", "snow", "wind", "fire"]
    items = [{"prompt": f"Item {i}: say something about {w}."} for i, w in enumerate(words)]
    args = MAACConfig(
        output_dir=out,
        num_generations=1,
        num_turns=2,
        early_termination_threshold=0.0,
        rollout_buffer_size=2,
        max_steps=1,
        max_completion_length=4,
        per_device_eval_batch_size=1,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )

    def rank_reward(c1, c2):  # rank 0's branches end after the first turn, rank 1's do not
        return [1.0 if rank == 0 else -1.0] * len(c1)

    trainer = MAACTrainer(
        model=tiny,
        critic_model=tiny,
        reward_funcs=rank_reward,
        external_transition=lambda agent_completions: [f"Go on: {c}" for c in agent_completions],
        args=args,
        train_dataset=items,
    )
    assert trainer.accelerator.process_index == rank
    result = {"rank": rank, "distributed_type": str(trainer.accelerator.distributed_type)}
    tensors = {}

    # 1. generation (2 samples per prompt, from the same seed): rank 1 has no prompts
    prompts = [[f"Tell me about {w}." for w in words[:2]], [f"Answer about {w}." for w in words[2:]]]
    torch.manual_seed(1)
    outs = trainer.generate(prompts if rank == 0 else [[], []], 2)
    result["generated"] = [[c.tolist() for c in o.completion_ids] for o in outs]
    with _plain_loading(trainer):
        local = AutoModelForCausalLM.from_pretrained(tiny)
    torch.manual_seed(1)  # a plain model: no collective
    alone = trainer.generate_with([local, local], trainer.tokenizers, prompts, 2, trainer.eos_ids)
    result["generated_alone"] = [[c.tolist() for c in o.completion_ids] for o in alone]

    # 2. FSDP2 full state dicts (collectives)
    if is_fsdp2(trainer.accelerator):
        agent = trainer.team.agents[0]
        tensors["every_rank"] = full_state_dict(agent)
        tensors["rank0_only"] = full_state_dict(agent, rank0_only=True)
        tensors["initial"] = {k: v.detach().clone() for k, v in local.state_dict().items()}

    # 3. the joint reward model, sharded for scoring: 3 batches of 1 on rank 0, 1 batch on rank 1
    rm = JointRewardModel.from_pretrained(tiny, seed=0, max_length=64).prepare_for_scoring(trainer.accelerator)
    result["rm_collective"] = rm.collective
    texts = [[f"topic {k}", "x"] for k in range(3 if rank == 0 else 1)]
    answers = [[f"answer {k}", "yes"] for k in range(len(texts))]
    result["scores"] = rm.score(texts, answers, batch_size=1)
    weights = rm.full_state_dict() or rm.hf_model.state_dict()  # gathered (every rank) when sharded
    with _plain_loading(trainer):
        local_rm = AutoModelForSequenceClassification.from_config(rm.hf_model.config)
    local_rm.load_state_dict(weights)
    result["scores_alone"] = JointRewardModel(local_rm, rm.tokenizer, 64).score(texts, answers, batch_size=1)

    # 4. one step; rank 0's branches all end after turn 1
    calls = []
    generate = trainer.generation.generate

    def counted(prompts_per_agent, num_generations, greedy=False):
        calls.append([len(p) for p in prompts_per_agent])
        return generate(prompts_per_agent, num_generations, greedy)

    trainer.generation.generate = counted
    trainer.train()
    result["global_step"] = trainer.state.global_step
    result["train_generate_calls"] = list(calls)

    # 5. evaluation: 2 batches on rank 0, 1 on rank 1 (and an empty one)
    calls.clear()
    run = trainer.rollout_engine.run
    first_turn = []

    def recorded(batch, *a, **k):
        rollout = run(batch, *a, **k)
        first_turn.extend(float(node.rewards.mean()) for node in rollout.nodes if node.turn == 0)
        return rollout

    trainer.rollout_engine.run = recorded
    metrics = trainer.evaluate_reward(items[:3])
    result["eval_generate_calls"] = list(calls)
    result["eval_first_turn_rewards"] = first_turn
    result["eval_turn_1_reward_mean"] = metrics["eval_turn_1/reward_mean"]
    result.update(uneven_lora_madpo(out, items[:3], rank))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    torch.save(tensors, os.path.join(out, f"rank{rank}.pt"))


def uneven_lora_madpo(out, items, rank):
    """`run_uneven` on a LoRA team (one shared base, one mixed-adapter `generate`) under MADPO:
    6. `generate` with prompts on rank 0 only, then on both ranks, from the same seed;
    7. pair collection on 3 items, one per batch: 2 batches on rank 0; on rank 1 one, then a filler item."""
    from peft import LoraConfig

    from trl_marl import MADPOConfig, MADPOTrainer
    from trl_marl.testing import tiny_model_path

    args = MADPOConfig(
        output_dir=os.path.join(out, "madpo"),
        share_base_model=True,
        preference_num_candidates=2,
        rollout_buffer_size=1,
        max_completion_length=4,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = MADPOTrainer(
        model=tiny_model_path(), reward_funcs=reward, args=args, train_dataset=items, peft_config=lora
    )
    prompts = [["Tell me about rain.", "Tell me about snow."], ["Answer about wind."]]
    torch.manual_seed(1)
    alone_share = trainer.generate(prompts if rank == 0 else [[], []], 2)
    torch.manual_seed(1)
    both = trainer.generate(prompts, 2)
    collected = []
    run = trainer.rollout_engine.run

    def recorded(batch, *a, **k):
        collected.append([item["prompt"] for item in batch])
        return run(batch, *a, **k)

    trainer.rollout_engine.run = recorded
    pairs = trainer.collect_preference_pairs()
    return {
        "lora_generated": [[c.tolist() for c in o.completion_ids] for o in alone_share],
        "lora_generated_both": [[c.tolist() for c in o.completion_ids] for o in both],
        "madpo_collect_batches": collected,
        "madpo_num_pairs": len(pairs),
    }


def run_ref_precompute(out):
    """MADPO `precompute_ref_log_probs` with a `ref_model` (sharded under ZeRO-3 / FSDP2: its forward is a
    collective) on 3 pairs, one per forward: rank 0 scores pairs 0 and 2, rank 1 pair 1 and then a filler. Each rank
    writes OUT/rank{r}.json: its forwards, every pair's gathered values, and those of a full local copy alone."""
    import copy

    from transformers import AutoModelForCausalLM

    from trl_marl import MADPOConfig, MADPOTrainer
    from trl_marl.testing import tiny_model_path

    rank = int(os.environ.get("RANK", "0"))
    tiny = tiny_model_path()
    items = [{"prompt": f"Item {i}: say something about {w}."} for i, w in enumerate(["rain", "snow", "wind"])]
    args = MADPOConfig(
        output_dir=out,
        preference_num_candidates=3,
        rollout_buffer_size=2,
        max_completion_length=4,
        train_batch_size=1,
        precompute_ref_log_probs=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = MADPOTrainer(model=tiny, reward_funcs=reward, args=args, train_dataset=items, ref_model=tiny)
    pairs = trainer.collect_preference_pairs()[:3]  # the same pairs on every rank
    forwards = []
    forward = trainer._reference_forward

    def counted(batch):
        forwards.append(len(batch))
        return forward(batch)

    trainer._reference_forward = counted
    mine = copy.deepcopy(pairs)
    trainer.precompute_reference_logps(mine)
    trainer._reference_forward = forward
    with _plain_loading(trainer):
        local = AutoModelForCausalLM.from_pretrained(tiny)

    def alone(prompt, completion):  # a plain forward of the local copy (no collective, no fused LM head)
        ids = torch.cat([prompt, completion])[None]
        logits = local(ids, position_ids=torch.arange(ids.shape[1])[None]).logits[0, len(prompt) - 1 : -1]
        logp = torch.log_softmax(logits.float() / trainer.team.temperature, -1)
        return logp.gather(1, completion[:, None]).sum().item()

    with torch.no_grad():
        ref_alone = [
            [alone(p.prompt_ids[i], p.winner_ids[i]) for i in range(2)]
            + [alone(p.prompt_ids[i], p.loser_ids[i]) for i in range(2)]
            for p in pairs
        ]
    result = {
        "rank": rank,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "num_pairs": len(pairs),
        "forwards": forwards,
        "ref": [p.ref_chosen_logps + p.ref_rejected_logps for p in mine],
        "ref_alone": ref_alone,
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
