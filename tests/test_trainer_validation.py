"""Bad input: each a clear error at construction, before any model loads."""

import pytest

from trl_marl import (
    MAGRPOConfig,
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MAReMaxConfig,
    MAReMaxTrainer,
    MARLOOConfig,
    MARLOOTrainer,
)

MISSING = "/nonexistent/model/path"  # loading it would raise OSError: every check must fire first


def reward(c1, c2):
    return [0.0] * len(c1)


def build(make_args, items, trainer=MAGRPOTrainer, **kw):
    args = kw.pop("args", None) or make_args()
    return trainer(**{"model": MISSING, "reward_funcs": reward, "args": args, "train_dataset": items, **kw})


def test_multi_turn_without_transition(make_args, items):
    with pytest.raises(ValueError, match="num_turns=2 needs an external_transition"):
        build(make_args, items, args=make_args(num_turns=2))


@pytest.mark.parametrize(
    "trainer, cfg", [(MAGRPOTrainer, MAGRPOConfig), (MARLOOTrainer, MARLOOConfig), (MAReMaxTrainer, MAReMaxConfig)]
)
def test_group_baselines_need_two_generations(make_args, items, trainer, cfg):
    with pytest.raises(ValueError, match="needs num_generations >= 2"):
        build(make_args, items, trainer=trainer, args=make_args(cfg, num_generations=1))


def test_mareinforce_accepts_one_generation(make_args, items, tiny_path):
    from trl_marl import MAREINFORCEConfig

    t = MAREINFORCETrainer(
        model=tiny_path,
        reward_funcs=reward,
        train_dataset=items,
        args=make_args(MAREINFORCEConfig, num_generations=1),
    )
    assert not t.args.seed_zscore and not t.rl_step.normalize


def test_unknown_joint_mode(make_args):
    with pytest.raises(ValueError, match="joint_mode must be one of \\['aligned', 'cross'\\]"):
        make_args(joint_mode="diagonal")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_agents", 0, "num_agents must be >= 1"),
        ("temperature", 0.0, r"temperature must be in \[0.01, 100\], got 0.0"),
        ("top_p", 1.5, "top_p must be in"),
        ("discount", 1.5, "discount must be in"),
        ("train_batch_size", 3, "train_batch_size \\(3\\) must be >= 1 and divide rollout_buffer_size \\(2\\)"),
        ("parallel_training", "threads", "parallel_training must be one of"),
    ],
)
def test_config_errors_name_the_field(make_args, field, value, message):
    with pytest.raises(ValueError, match=message):
        make_args(**{field: value})


def test_mp_without_devices(make_args):
    with pytest.raises(ValueError, match="parallel_training='mp' needs agent_devices"):
        make_args(parallel_training="mp")


def test_formatter_list_of_wrong_length(make_args, items):
    with pytest.raises(ValueError, match="formatters has 3 entries but num_agents is 2"):
        build(make_args, items, formatters=[str, str, str])


def test_tokenizer_list_of_wrong_length(make_args, items, tiny_tokenizer):
    with pytest.raises(ValueError, match="tokenizer list has 1 entries but num_agents is 2"):
        build(make_args, items, processing_class=[tiny_tokenizer])


def test_agent_model_object_with_several_agents(make_args, items):
    import torch

    with pytest.raises(ValueError, match="model is one model object but num_agents=2"):
        build(make_args, items, model=torch.nn.Linear(1, 1))


def test_neither_agent_model_nor_agents(make_args, items):
    with pytest.raises(ValueError, match="pass model= .* agent_model=, agents="):
        build(make_args, items, model=None)


def test_agents_list_length(make_args, items):
    with pytest.raises(ValueError, match=r"model has 3 entries \(one per agent\) but num_agents is 2"):
        build(make_args, items, model=[MISSING] * 3)


def test_empty_dataset(make_args):
    from datasets import Dataset

    with pytest.raises(ValueError, match="train_dataset is empty"):
        build(make_args, Dataset.from_list([]))
    with pytest.raises(ValueError, match="train_dataset is empty"):
        build(make_args, None)


def test_reward_with_wrong_signature(make_args, items):
    with pytest.raises(TypeError, match="takes 4 required positional"):
        build(make_args, items, reward_funcs=lambda a, b, c, d: [])


def test_missing_reward(make_args, items):
    with pytest.raises(ValueError, match="reward_funcs is required"):
        build(make_args, items, reward_funcs=None)


def _trainer(make_args, items, tiny_path, reward_func):
    return MAGRPOTrainer(model=tiny_path, reward_funcs=reward_func, args=make_args(), train_dataset=items)


def test_reward_returning_wrong_length_fails_on_first_call(make_args, items, tiny_path):
    def one_reward_only(c1, c2):
        return [1.0]

    t = _trainer(make_args, items, tiny_path, one_reward_only)
    with pytest.raises(ValueError, match="one_reward_only.*returned 1 rewards for 4 joint actions"):
        t.train()


def test_reward_returning_nan_fails_on_first_call(make_args, items, tiny_path):
    def nan_reward(c1, c2):
        return [float("nan")] * len(c1)

    t = _trainer(make_args, items, tiny_path, nan_reward)
    with pytest.raises(ValueError, match="nan_reward.*at index 0.*finite"):
        t.train()


def test_dataset_smaller_than_a_rollout_batch(make_args, items, tiny_path):
    t = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=reward,
        train_dataset=items.select(range(1)),
        args=make_args(rollout_buffer_size=2),
    )
    with pytest.raises(ValueError, match="fewer than one rollout batch"):
        t.train()


def test_items_left_over_after_the_last_rollout_batch_are_announced(make_args, items, tiny_path, caplog):
    t = MAGRPOTrainer(model=tiny_path, reward_funcs=reward, train_dataset=items.select(range(7)), args=make_args())
    with caplog.at_level("WARNING", logger="trl_marl.trainers.base"):
        loader = t.get_train_dataloader()
    assert "has 7 items" in caplog.text and "skips the 1 left" in caplog.text
    assert len(loader) == 3  # 3 rollout batches of 2 items; the 7th item waits for another epoch's shuffle
    caplog.clear()
    t.train_dataset = items.select(range(6))
    with caplog.at_level("WARNING", logger="trl_marl.trainers.base"):
        t.get_train_dataloader()
    assert "rollout batch" not in caplog.text


@pytest.mark.parametrize(
    "trainer_name, wrong_config, expected",
    [
        ("MAGRPOTrainer", "MADPOConfig", "MAGRPOConfig"),
        ("MAACTrainer", "MAGRPOConfig", "MAACConfig"),
        ("MADPOTrainer", "MAGRPOConfig", "MADPOConfig"),
        ("MARLHFTrainer", "MADPOConfig", "MARLHFConfig"),
        ("MADPOIterTrainer", "MADPOConfig", "MADPOIterConfig"),
    ],
)
def test_args_of_another_trainer_fail_with_the_expected_class(make_args, items, trainer_name, wrong_config, expected):
    import trl_marl

    args = make_args(getattr(trl_marl, wrong_config))
    with pytest.raises(TypeError, match=f"args must be a {expected}, got {wrong_config}"):
        build(make_args, items, getattr(trl_marl, trainer_name), args=args)


# ---------------------------------------------------------------------------------------------- silent inputs (issue 14)
@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"learning_rate": -1e-3}, "learning_rate must be >= 0, got -0.001"),
        ({"agent_learning_rate": -1.0}, "agent_learning_rate must be None or >= 0"),
        ({"max_prompt_length": 0}, r"max_prompt_length must be None \(keep prompts whole\) or >= 1, got 0"),
    ],
)
def test_silent_config_values_are_refused(make_args, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_args(**overrides)


@pytest.mark.parametrize("config", ["MAGRPOConfig", "MAPPOConfig", "MADPOConfig", "MARLHFConfig"])
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"gradient_accumulation_steps": 0}, r"gradient_accumulation_steps must be >= 1 .*got 0"),
        ({"gradient_accumulation_steps": -2}, r"gradient_accumulation_steps must be >= 1 .*got -2"),
        ({"max_steps": -1, "num_train_epochs": 0}, r"num_train_epochs must be > 0 when max_steps=-1 .*got 0"),
        ({"max_steps": -1, "num_train_epochs": -1}, r"num_train_epochs must be > 0 when max_steps=-1 .*got -1"),
        ({"num_completions_to_print": -1}, r"num_completions_to_print must be None \(every row\) or >= 0, got -1"),
    ],
)
def test_meaningless_trainer_counts_are_refused(make_args, config, overrides, message):
    """TrainingArguments accepts these: gradient_accumulation_steps=0 failed in train() with transformers'
    ZeroDivisionError, num_train_epochs <= 0 (max_steps=-1) trained 0 steps and reported success, and a negative
    num_completions_to_print printed nothing. On the old code every config was accepted."""
    import trl_marl

    with pytest.raises(ValueError, match=message):
        make_args(getattr(trl_marl, config), **overrides)


def test_counts_at_their_limits_are_accepted(make_args):
    args = make_args(max_steps=-1, num_train_epochs=0.5, num_completions_to_print=0, gradient_accumulation_steps=1)
    assert args.num_train_epochs == 0.5 and args.num_completions_to_print == 0
    assert make_args(max_steps=3, num_train_epochs=0).max_steps == 3  # max_steps wins: the epochs are not read
    assert make_args(weight_decay=-0.1).weight_decay == -0.1  # TrainingArguments and TRL's configs accept it too


def test_eval_dataset_without_the_formatters_column_fails_at_construction(make_args, items, tiny_path):
    from datasets import Dataset

    eval_items = Dataset.from_list([{"prompt": "p"}])  # no "topic" column
    formatters = [lambda x: x["prompt"], lambda x: f"About {x['topic']}"]
    with pytest.raises(
        ValueError,
        match=r"eval_dataset\[0\]: the formatter of agent 2 .* columns \['prompt'\]: "
        r"KeyError: 'topic'",
    ):
        MAGRPOTrainer(
            model=tiny_path,
            reward_funcs=lambda a, b: [1.0] * len(a),
            args=make_args(),
            train_dataset=items,
            eval_dataset=eval_items,
            formatters=formatters,
        )


def test_string_and_bare_float_rewards_are_named(make_args, items, tiny_path):
    def string_reward(c1, c2):
        return ["1.0"] * len(c1)

    with pytest.raises(
        TypeError, match=r"string_reward.*returned the string '1.0' at index 0; rewards must be numbers"
    ):
        _trainer(make_args, items, tiny_path, string_reward).train()

    def bare_float(c1, c2):
        return 1.0

    with pytest.raises(TypeError, match=r"bare_float.*returned a single number \(1.0\) for 4 joint action\(s\)"):
        _trainer(make_args, items, tiny_path, bare_float).train()


def test_formatter_key_error_at_run_time_names_the_agent(make_args, items, tiny_path):
    from trl_marl.rollout.engine import JointRollout

    def needs_question(x):
        return x["question"]

    engine = JointRollout.__new__(JointRollout)
    engine.formatters, engine.num_agents = [lambda x: x["prompt"], needs_question], 2
    with pytest.raises(KeyError, match=r"the formatter of agent 2 \(.*needs_question\) .*KeyError: 'question'"):
        engine.format(1, {"prompt": "p"})


def test_mistyped_local_folder_says_folder_not_found(make_args, items, tmp_path):
    with pytest.raises(FileNotFoundError, match="model folder not found: .*no such local folder"):
        MAGRPOTrainer(
            model=str(tmp_path / "modles" / "tiny"),
            reward_funcs=lambda a, b: [1.0] * len(a),
            args=make_args(),
            train_dataset=items,
        )
