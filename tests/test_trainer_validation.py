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


def test_reward_returning_none_is_refused_with_trls_meaning_of_it(make_args, items, tiny_path):
    """TRL reads None as "this function does not apply" (NaN in its nansum); the error says so and what to return."""

    def sometimes_none(c1, c2):
        return [None if j == 1 else 1.0 for j in range(len(c1))]

    t = _trainer(make_args, items, tiny_path, sometimes_none)
    with pytest.raises(TypeError, match=r"sometimes_none' returned None at index 1.*TRL reads None as.*return 0\.0"):
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


@pytest.mark.parametrize("config", ["MAGRPOConfig", "MAPPOConfig", "MADPOConfig"])
@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"save_strategy": "steps", "save_steps": 0},
            r"save_steps=0 with save_strategy='steps': save_steps must be an integer >= 1 .*\(0, 1\)",
        ),
        ({"save_strategy": "steps", "save_steps": -5}, r"save_steps=-5 with save_strategy='steps'"),
        ({"save_strategy": "steps", "save_steps": 2.5}, r"save_steps=2.5 with save_strategy='steps'"),
        (
            {"eval_strategy": "steps", "eval_steps": 0},
            r"eval_steps=0 .*or None \(every logging_steps steps.*write None",
        ),
        ({"eval_strategy": "steps", "eval_steps": -1}, r"eval_steps=-1 with eval_strategy='steps'"),
        ({"logging_steps": -2}, r"logging_steps=-2 with logging_strategy='steps'.*or set logging_strategy='no'"),
    ],
)
def test_step_intervals_that_never_fire_are_refused(make_args, config, overrides, message):
    """transformers accepts these under the "steps" strategy and reads a value below 1 as a fraction of the run:
    save_steps=0 (or negative) never saved a checkpoint, a negative logging_steps never logged, eval_steps=0 silently
    became logging_steps. On the old code every one was accepted (save_steps=2.5 by transformers' own message)."""
    import trl_marl

    with pytest.raises(ValueError, match=message):
        make_args(getattr(trl_marl, config), **overrides)


def test_step_intervals_transformers_honours_are_accepted(make_args):
    args = make_args(save_strategy="steps", save_steps=0.25, eval_strategy="steps", eval_steps=None, logging_steps=0.5)
    assert (args.save_steps, args.eval_steps, args.logging_steps) == (0.25, 0.5, 0.5)  # eval_steps: logging_steps'
    assert make_args(save_strategy="steps", save_steps=10.0).save_steps == 10
    # another strategy does not read the field (as in transformers)
    assert make_args(save_strategy="no", save_steps=0, logging_strategy="no", logging_steps=0).save_steps == 0


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


# ------------------------------------------------------------------------- prompts: every row checked, bad ones named
def _topics(n=8, bad=None, chat=False):
    """`n` task items, row k's prompt replaced by `bad[k]`; `chat`: prompts as chat messages."""
    rows = [{"prompt": f"Write about topic {i}.", "topic": str(i)} for i in range(n)]
    if chat:
        rows = [{**r, "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": r["prompt"]}]}
                for r in rows]  # fmt: skip
    for k, value in (bad or {}).items():
        rows[k] = {**rows[k], "prompt": value}
    return rows


def _as(kind, rows):
    from datasets import Dataset

    return Dataset.from_list(rows) if kind == "Dataset" else rows


@pytest.mark.parametrize("kind", ["Dataset", "list"])
@pytest.mark.parametrize(
    "trainer, config",
    [("MAGRPOTrainer", "MAGRPOConfig"), ("MAPPOTrainer", "MAPPOConfig"), ("IACTrainer", "IACConfig"),
     ("MADPOTrainer", "MADPOConfig"), ("MARLHFTrainer", "MARLHFConfig")],
)  # fmt: skip
def test_an_empty_prompt_in_a_later_row_is_refused_at_construction_naming_the_row(make_args, kind, trainer, config):
    """Audit: `{"prompt": ""}` in any row crashed `train()` with transformers' bare `IndexError: index -1 is out of
    bounds for dimension 1 with size 0` when the row was sampled (only item 0 was checked). Every trainer that
    generates from task items reads the column at construction, before any model loads (old code: the missing model
    was the first error)."""
    import trl_marl

    args = make_args(getattr(trl_marl, config))
    kw = {"critic_model": MISSING} if trainer == "MAPPOTrainer" else {}
    with pytest.raises(
        ValueError,
        match=r"^train_dataset\[5\]\['prompt'\] is an empty string; the default formatter makes it the prompt of "
        r"agents 1, 2, and a prompt must be a non-empty string or a non-empty list of chat messages .*Every row's "
        r"prompt is checked when the trainer is built: fix or drop the rows",
    ):
        build(make_args, _as(kind, _topics(bad={5: ""})), getattr(trl_marl, trainer), args=args, **kw)


@pytest.mark.parametrize(
    "kind, bad, message",
    [
        ("Dataset", {3: None, 6: None}, r"train_dataset\[3\]\['prompt'\] is None \(missing\) \(1 more of its 8 rows are bad too\)"),
        ("list", {3: None}, r"train_dataset\[3\]\['prompt'\] is None \(missing\);"),
        ("list", {6: 7}, r"train_dataset\[6\]\['prompt'\] is an int \(7\), not a string or chat messages;"),
        ("list", {2: ["a", "b"]}, r"train_dataset\[2\]\['prompt'\] is a list whose entry 0 is a str \('a'\), not a chat"),
    ],
)  # fmt: skip
def test_a_prompt_that_is_not_text_in_a_later_row_is_named_at_construction(make_args, kind, bad, message):
    """Audit: `prompt=None` or an int in a row failed when the row was sampled with `TypeError: a formatter must
    return a string or a list of chat messages, got NoneType`, naming no row, agent or column (or never, when the
    row was not sampled within max_steps)."""
    with pytest.raises(ValueError, match="^" + message):
        build(make_args, _as(kind, _topics(bad=bad)))


@pytest.mark.parametrize("kind", ["Dataset", "list"])
def test_a_chat_message_without_a_role_in_a_later_row_is_named_at_construction(make_args, kind):
    """Audit: a message without a 'role' reached the chat template at the rollout: jinja2's bare
    `UndefinedError: 'dict object' has no attribute 'role'`."""
    bad = {4: [{"role": "user", "content": "Write."}, {"content": "no role here"}]}
    with pytest.raises(
        ValueError,
        match=r"^train_dataset\[4\]\['prompt'\] has a chat message \(entry 1\) without a 'role' \(its keys: "
        r"\['content'\]\); the default formatter makes it the prompt of agents 1, 2",
    ):
        build(make_args, _as(kind, _topics(bad=bad, chat=True)))


def test_a_custom_formatter_that_returns_no_prompt_on_the_first_item_is_named_at_construction(make_args, items):
    """A custom formatter's output is checked on the first item (the rows after it only when rolled out): None, a
    number or a message without a 'role' (old code: the formatter had to raise to be caught)."""
    with pytest.raises(
        ValueError,
        match=r"^train_dataset\[0\]: the prompt that the formatter of agent 2 \(.*no_role\) returns has a chat message "
        r"\(entry 0\) without a 'role' \(its keys: \['content'\]\); a prompt must be a non-empty string",
    ):

        def no_role(item):
            return [{"content": item["prompt"]}]

        build(make_args, items, formatters=[lambda item: item["prompt"], no_role])


def test_the_eval_dataset_and_the_agents_reading_the_column_are_named(make_args, items):
    """Only the agents whose formatter is the default one read the column as their prompt; the eval dataset is
    checked as the training one is (evaluation after training would meet it)."""
    from datasets import Dataset

    from trl_marl.rollout.prompts import default_formatter

    with pytest.raises(ValueError, match=r"^eval_dataset\[2\]\['prompt'\] is an empty string; .* prompt of agent 1, "):
        build(
            make_args,
            items,
            eval_dataset=Dataset.from_list(_topics(4, bad={2: ""})),
            formatters=[default_formatter, lambda item: f"About {item['topic']}"],
        )


def _json(rows):
    """`rows` as a Dataset whose prompt column is `datasets.Json` (what a JSON file mixing the kinds loads as)."""
    from datasets import Dataset, Features, Json, Value

    return Dataset.from_list(rows, features=Features({"prompt": Json(), "topic": Value("string")}))


@pytest.mark.parametrize("kind", ["list", "Json Dataset", "list of chat rows"])
def test_a_prompt_column_mixing_strings_and_chat_messages_is_refused_naming_the_first_row_of_each_kind(
    make_args, kind
):
    """Audit: a column mixing plain strings and chat messages was rolled out batch by batch with one setting (a
    batch's first row decides whether its prompts are tokenized with special tokens, as TRL's
    `is_conversational(inputs[0])`): the other kind's rows were mis-tokenized, silently (old code: construction went
    on to load the missing model)."""
    chat = kind == "list of chat rows"
    other = "Write about topic 5." if chat else [{"role": "user", "content": "Write about topic 5."}]
    rows = _topics(bad={5: other, 7: other}, chat=chat)
    first, second = ("chat messages", "a string") if chat else ("a string", "chat messages")
    with pytest.raises(
        ValueError,
        match=rf"^train_dataset\[0\]\['prompt'\] is {first} but train_dataset\[5\]\['prompt'\] is {second} \(the first "
        r"row of each kind\); the default formatter makes the column the prompt of agents 1, 2, and an agent's prompts "
        r"must all be one kind: .* Make them all one kind, e.g. wrap each string s as \[\{'role': 'user', "
        r"'content': s\}\]. Every row's prompt is checked when the trainer is built$",
    ):
        build(make_args, _json(rows) if kind == "Json Dataset" else rows)


def test_a_train_and_an_eval_dataset_of_different_kinds_are_refused(make_args):
    """A plain-string training set with a chat-message eval set mixes the kinds of one agent's prompts (old code:
    the first evaluation, after training, tokenized them with the setting training had left)."""
    from datasets import Dataset

    with pytest.raises(
        ValueError,
        match=r"^train_dataset\[0\]\['prompt'\] is a string but eval_dataset\[0\]\['prompt'\] is chat messages",
    ):
        build(make_args, Dataset.from_list(_topics()), eval_dataset=Dataset.from_list(_topics(4, chat=True)))
    with pytest.raises(
        ValueError,
        match=r"^eval_dataset\[0\]: the prompt that the formatter of agent 2 \(.*\) returns is chat messages, but on "
        r"train_dataset\[0\] it returns a string; an agent's prompts must all be one kind",
    ):  # a custom formatter: compared on each dataset's first item (the rollout compares every later one)

        def chat_on_eval(item):
            return [{"role": "user", "content": item["prompt"]}] if item.get("eval") else item["prompt"]

        evaluation = [{**row, "eval": True} for row in _topics(4)]
        build(make_args, _topics(), eval_dataset=evaluation, formatters=[lambda item: item["prompt"], chat_on_eval])


def test_a_bad_prompt_in_a_json_column_is_named_and_chat_messages_nested_as_json_pass(make_args):
    """A `datasets.Json` column holds JSON text: its rows were checked as that text (old code: `""` read as the
    non-empty text '""' passed, and chat messages of a `List(Json())` column were refused as 'a list whose entry 0 is
    a str'). They are checked as the rows read them."""
    from datasets import Dataset, Features, Json, List, Value

    with pytest.raises(ValueError, match=r"^train_dataset\[3\]\['prompt'\] is an empty string; "):
        build(make_args, _json(_topics(bad={3: ""})))
    features = Features({"prompt": List(Json()), "topic": Value("string")})
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        build(make_args, Dataset.from_list(_topics(chat=True), features=features))


def echo(text: str) -> str:
    """Repeat a text.

    Args:
        text: what to repeat.
    """
    return text


@pytest.mark.parametrize(
    "dataset",
    ["Dataset", "list", "chat Dataset", "chat list", "filtered Dataset", "shuffled Dataset", "Json Dataset", "agentic",
     "agentic mixed"],
)  # fmt: skip
def test_valid_prompts_pass_the_row_checks(make_args, dataset):
    """Plain and conversational prompts, as a Dataset or a list; a Dataset whose bad rows a `filter` dropped (its
    table still holds them) or that is shuffled; an agentic team's empty prompts (the environment's reset() adds the
    task; it makes a string a user message, so its prompts may mix the kinds): every check passes and construction
    goes on to load the (missing) model."""
    from datasets import Dataset

    kw = {}
    if dataset == "agentic":
        rows, kw["tools"] = _topics(bad={k: "" for k in range(8)}), [echo]
    elif dataset == "agentic mixed":
        rows, kw["tools"] = _topics(bad={3: [{"role": "user", "content": "Hi"}]}), [echo]
    elif dataset == "Json Dataset":
        rows = _json(_topics(chat=True))
    elif dataset.startswith("chat"):
        rows = _topics(chat=True)
    elif dataset == "filtered Dataset":
        rows = Dataset.from_list(_topics(bad={1: "", 6: None})).filter(lambda item: bool(item["prompt"]))
        assert len(rows) == 6 and len(rows.data) == 8
    elif dataset == "shuffled Dataset":
        rows = Dataset.from_list(_topics()).shuffle(seed=0)
    else:
        rows = _topics()
    if isinstance(rows, list) and dataset.endswith("Dataset"):
        rows = Dataset.from_list(rows)
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        build(make_args, rows, **kw)


def test_a_prompt_that_tokenizes_to_nothing_stops_the_rollout_naming_the_item_and_the_agent(
    make_args, tiny_path, tiny_tokenizer
):
    """Audit: a prompt with text but no tokens (whitespace, with a tokenizer that strips it) passes every check of
    its text and reached transformers' `generate`: `IndexError: index -1 is out of bounds for dimension 1 with size
    0`. The rollout tokenizes each prompt first and names the item and the agent (old code: that IndexError)."""
    from tokenizers import normalizers

    from trl_marl.rollout.prompts import PromptError

    tiny_tokenizer.backend_tokenizer.normalizer = normalizers.Strip()
    assert tiny_tokenizer("   ")["input_ids"] == [] and tiny_tokenizer(" a ")["input_ids"]
    trainer = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=reward,
        args=make_args(),
        train_dataset=[{"prompt": "   ", "topic": str(i)} for i in range(4)],
        processing_class=tiny_tokenizer,
    )
    with pytest.raises(
        PromptError,
        match=r"^the task item \{'prompt': '   ', 'topic': '\d'\}: agent 1's prompt '   ' has no tokens \(its "
        r"tokenizer keeps none of its characters\), and generation needs at least one; fix or drop the item",
    ):
        trainer.train()


def test_a_formatter_that_returns_no_prompt_at_a_later_step_saves_the_run_and_names_the_item(
    make_args, tiny_path, items
):
    """A custom formatter's output is known only when its item is rolled out: one that returns "" at step 2 stops
    the run with an error naming the item and the agent (old code: transformers' bare IndexError), after writing
    checkpoint-1 as a dead vLLM server does (`save_after_failure`); fixed, the run resumes from it."""
    from transformers import TrainerCallback

    from trl_marl.rollout.prompts import PromptError, default_formatter

    broken = {"now": False}

    class BreakAfterStep1(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            broken["now"] = True

    def about(item):
        return "" if broken["now"] else f"About {item['topic']}"

    out = make_args(max_steps=2).output_dir
    trainer = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=reward,
        args=make_args(max_steps=2),
        train_dataset=items,
        formatters=[default_formatter, about],
        callbacks=[BreakAfterStep1()],
    )
    with pytest.raises(
        PromptError,
        match=r"^the task item \{'prompt': 'Write about topic \d\.', 'topic': '\d'\}: agent 2's prompt is an empty "
        r"string; a prompt must be a non-empty string",
    ) as err:
        trainer.train()
    assert trainer.state.global_step == 1
    note = " ".join(err.value.__notes__)
    assert f"the run stopped after step 1: {out}/checkpoint-1 holds it; fix or drop the item, then resume" in note

    broken["now"] = False
    resumed = MAGRPOTrainer(
        model=tiny_path,
        reward_funcs=reward,
        args=make_args(max_steps=2),
        train_dataset=items,
        formatters=[default_formatter, lambda item: f"About {item['topic']}"],
    )
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 2


def test_a_chat_template_that_fails_on_a_prompt_names_the_item_and_the_agent(tiny_tokenizer):
    """A chat template's own error (a template that refuses a conversation) is raised naming the item, the agent and
    the template's message (old code: jinja2's error alone)."""
    import copy

    from trl_marl.rollout.engine import JointRollout
    from trl_marl.rollout.prompts import PromptError, PromptRenderer

    strict = copy.deepcopy(tiny_tokenizer)
    strict.chat_template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    from trl_marl.rewards import RewardFunction

    never_scored = RewardFunction(lambda *completions: [0.0] * len(completions[0]), 2)
    formatters = [lambda item: "plain text", lambda item: item["prompt"]]
    engine = JointRollout(2, formatters, PromptRenderer([tiny_tokenizer, strict]), never_scored, num_generations=1)
    item = {"prompt": [{"role": "user", "content": "Hi"}], "id": 7}
    with pytest.raises(
        PromptError,
        match=r"^the task item \{'prompt': \[\{'role': 'user', 'content': 'Hi'\}\], 'id': 7\}: agent 2's prompt "
        r"cannot be rendered: TemplateError: Conversation roles must alternate user/assistant; fix or drop the item$",
    ):
        engine.first_prompts(item)


def test_dataset_kinds_a_user_reaches_for_get_the_conversion_to_use(make_args, items):
    """A streamed dataset, a dict of columns, a DataFrame, a DatasetDict or a dataset name as train_dataset, a string
    as formatters or processing_class, a dict as peft_config: each named with what to pass, before any model loads.
    The old code: `object of type 'IterableDataset' has no len()`, `KeyError: 0`, "formatters has 6 entries",
    "'str' object has no attribute 'pad_token_id'", a PEFT wrapping error after loading."""
    import pandas as pd
    from datasets import DatasetDict

    rows = items.to_list()
    cases = [
        (dict(train_dataset=items.to_iterable_dataset()), TypeError, r"IterableDataset \(streamed\).*streaming=False"),
        (dict(train_dataset=items.to_dict()), TypeError, r"a dict of columns: pass datasets.Dataset.from_dict"),
        (dict(train_dataset=pd.DataFrame(rows)), TypeError, r"pandas DataFrame: pass datasets.Dataset.from_pandas"),
        (dict(train_dataset=DatasetDict(train=items)), ValueError, r"DatasetDict with the splits \['train'\]"),
        (dict(train_dataset="my/dataset"), TypeError, r"is a string \('my/dataset'\): load it first"),
        (dict(eval_dataset=items.to_iterable_dataset()), TypeError, r"eval_dataset is a datasets.IterableDataset"),
        (dict(formatters="prompt"), TypeError, r"got the string 'prompt'; to read a column.*item\['prompt'\]"),
        (dict(processing_class="my/tokenizer"), TypeError, r"processing_class is the string 'my/tokenizer'"),
        (dict(peft_config={"r": 8}), TypeError, r"peft_config must be a peft.PeftConfig, got dict.*LoraConfig\(\*\*"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            build(make_args, items, **kwargs)


# ------------------------------------------------------------------------------- device lists checked at construction
def _missing_device() -> str:
    """A device this machine does not have: the first CUDA index past its GPUs (cuda:0 on a CPU-only machine)."""
    import torch

    return f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"


@pytest.mark.parametrize(
    "config, overrides, label",
    [
        ("MAGRPOConfig", {"parallel_training": "mp", "agent_devices": ["cpu", "MISSING"]}, r"agent_devices\[1\]"),
        ("MAGRPOConfig", {"reference_kl_enabled": True, "reference_devices": ["MISSING"]}, r"reference_devices\[0\]"),
        (
            "MAPPOConfig",
            {"parallel_training": "mp", "agent_devices": ["cpu"], "critic_devices": ["MISSING"]},
            r"critic_devices\[0\]",
        ),
        (
            "MARLHFConfig",
            {
                "rl_algorithm": "iac",
                "parallel_training": "mp",
                "agent_devices": ["cpu"],
                "critic_devices": ["cpu", "MISSING"],
            },
            r"critic_devices\[1\]",
        ),
        (
            "MADPOIterConfig",
            {"comparator_policy": "current_copy", "comparator_kwargs": {"devices": ["MISSING"]}},
            r"comparator_kwargs\['devices'\]\[0\]",
        ),
        (
            "MADPOIterConfig",
            {"comparator_policy": "current_copy", "comparator_devices": ["cpu", "MISSING"]},
            r"comparator_kwargs\['devices'\]\[1\]",
        ),
    ],
)
def test_a_device_list_entry_this_machine_lacks_is_refused_at_construction_naming_the_entry(
    make_args, config, overrides, label
):
    """On the old code every one was accepted and failed only when the model was placed (after loading, or for
    MARLHF's critics after pair collection and the reward model's fit)."""
    import warnings

    import trl_marl

    missing = _missing_device()
    overrides = {
        k: [missing if d == "MISSING" else d for d in v]
        if isinstance(v, list)
        else (
            {kk: [missing if d == "MISSING" else d for d in vv] for kk, vv in v.items()} if isinstance(v, dict) else v
        )
        for k, v in overrides.items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # comparator_devices: the deprecated spelling
        with pytest.raises(ValueError, match=rf"{label}='{missing}': this machine has .*use one of \['cpu'"):
            make_args(getattr(trl_marl, config), **overrides)


def test_a_device_list_given_as_one_string_or_with_a_none_entry_is_refused(make_args):
    """A bare string was read letter by letter ("cpu" counted 3 entries; "cuda" passed for 4 agents as c, u, d, a)."""
    with pytest.raises(ValueError, match=r"agent_devices='cpu' is a string; agent_devices takes a list .*\['cpu'\]"):
        make_args(parallel_training="mp", agent_devices="cpu")
    with pytest.raises(ValueError, match=r"agent_devices\[1\]=None is not a device"):
        make_args(parallel_training="mp", agent_devices=["cpu", None])
    assert make_args(parallel_training="mp", agent_devices=["cpu", "cpu"]).agent_devices == ["cpu", "cpu"]


@pytest.mark.parametrize(
    "config, overrides, name",
    [
        ("MAGRPOConfig", {"agent_devices": ["cpu"]}, "agent_devices"),
        ("MADPOConfig", {"agent_devices": ["cpu", "cpu"]}, "agent_devices"),
        ("MAACConfig", {"critic_devices": ["cpu"]}, "critic_devices"),
        ("IACConfig", {"critic_devices": ["cpu"]}, "critic_devices"),
        ("MAPPOConfig", {"critic_devices": ["cpu"]}, "critic_devices"),
        ("MARLHFConfig", {"rl_algorithm": "maac", "critic_devices": ["cpu"]}, "critic_devices"),
    ],
)
def test_a_device_list_read_only_in_mp_mode_is_refused_with_parallel_training_none(make_args, config, overrides, name):
    """On the old code each was accepted and ignored: with parallel_training='none' accelerate places the agents and
    critics, and only `parallel_training="mp"` reads agent_devices / critic_devices."""
    import trl_marl

    with pytest.raises(
        ValueError, match=rf"{name}=\['cpu'.*read in parallel_training='mp' only; .*set parallel_training='mp'"
    ):
        make_args(getattr(trl_marl, config), **overrides)
    # read in both modes: each reference beside its agent, or on reference_devices (trl_marl.trainers.building)
    args = make_args(reference_kl_enabled=True, reference_devices=["cpu"])
    assert args.parallel_training == "none" and args.reference_devices == ["cpu"]


def test_reference_devices_are_refused_when_the_run_scores_no_reference(make_args):
    """reference_devices places the frozen references, built only for the reward-side KL or TRL's loss with a
    loss-side beta > 0 (old code: accepted and ignored when neither was on)."""
    from trl_marl import MAPPOConfig

    with pytest.raises(ValueError, match=r"reference_devices=\['cpu'\] places the frozen references.*scores none"):
        make_args(reference_devices=["cpu"])
    with pytest.raises(ValueError, match="scores none"):
        make_args(loss_type="grpo", beta=0.0, reference_devices=["cpu"])
    with pytest.raises(ValueError, match="scores none"):
        make_args(MAPPOConfig, reference_devices=["cpu"])
    for kept in (
        make_args(reference_kl_enabled=True, reference_devices=["cpu"]),
        make_args(loss_type="grpo", beta=0.04, reference_devices=["cpu"]),
        make_args(loss_type="grpo", beta=[0.0, 0.1], reference_devices=["cpu"]),
        make_args(MAPPOConfig, reference_kl_enabled=True, reference_devices=["cpu"]),
    ):
        assert kept.scores_reference and kept.reference_devices == ["cpu"]


def test_critic_devices_with_value_heads_on_the_actors_are_refused(make_args):
    """IAC's value heads sit on their agents: critic_devices placed nothing (old code: accepted, even in mp mode)."""
    from trl_marl import IACConfig, MARLHFConfig

    mp = {"parallel_training": "mp", "agent_devices": ["cpu"], "critic_devices": ["cpu"]}
    for cfg, extra in ((IACConfig, {}), (MARLHFConfig, {"rl_algorithm": "iac"})):
        with pytest.raises(
            ValueError, match=r"critic_devices=\['cpu'\] places separate critic models.*use_separate_critic=False"
        ):
            make_args(cfg, use_separate_critic=False, **mp, **extra)
        assert make_args(cfg, **mp, **extra).critic_devices == ["cpu"]
