"""The reward calling convention: every signature form, keywords, validation, processors."""

import math

import pytest
import torch

from trl_marl.rewards import RewardFunction, RewardProcessors, clip, compose, scale, shift

A = ["a", "bb", "ccc"]
B = ["x", "yy", "zzz"]
PROMPTS = ["p1", "p2", "p3"]
ITEMS = [{"prompt": "p1", "k": 1}, {"prompt": "p2", "k": 2}, {"prompt": "p3", "k": 3}]


def call(func, n=2, **kw):
    return RewardFunction(func, n, **kw).raw([A, B][:n] if n <= 2 else [A, B, A], PROMPTS, ITEMS)


def test_one_positional_list_per_agent():
    def f(c1, c2):
        return [len(x) + 10 * len(y) for x, y in zip(c1, c2)]

    assert call(f).tolist() == [11.0, 22.0, 33.0]


def test_prompts_first():
    seen = {}

    def f(prompts, c1, c2):
        seen["prompts"] = prompts
        return [1.0] * len(c1)

    call(f)
    assert seen["prompts"] == PROMPTS


def test_single_nested_list():
    def f(completions):
        assert completions == [A, B]
        return [0.5] * 3

    assert call(f).tolist() == [0.5, 0.5, 0.5]


def test_varargs_and_keywords():
    seen = {}

    def f(*completions, batch_items=None, prompts=None):
        seen.update(n=len(completions), items=batch_items, prompts=prompts)
        return [0.0] * 3

    call(f)
    assert seen == {"n": 2, "items": ITEMS, "prompts": PROMPTS}


def test_kwargs_catch_all_receives_batch_items_and_prompts():
    seen = {}

    def f(c1, c2, **kwargs):
        seen.update(kwargs)
        return [0.0] * 3

    call(f)
    assert seen == {"batch_items": ITEMS, "prompts": PROMPTS}


def test_called_once_for_all_joint_actions():
    calls = []

    def f(c1, c2):
        calls.append(len(c1))
        return [0.0] * len(c1)

    call(f)
    assert calls == [3]


def test_single_agent_and_three_agents():
    assert RewardFunction(lambda c: [len(x) for x in c], 1).raw([A]).tolist() == [1.0, 2.0, 3.0]
    f3 = RewardFunction(lambda a, b, c: [1.0] * len(a), 3)
    assert f3.raw([A, B, A]).tolist() == [1.0, 1.0, 1.0]


def test_bad_signature_is_an_error_at_construction():
    def bad(a, b, c, d):
        return []

    with pytest.raises(TypeError, match="takes 4 required positional argument"):
        RewardFunction(bad, 2)


def test_wrong_length_names_the_function():
    def short_reward(c1, c2):
        return [1.0]

    with pytest.raises(ValueError, match="short_reward.*returned 1 rewards for 3 joint actions"):
        call(short_reward)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_names_the_function_and_index(bad):
    def nan_reward(c1, c2):
        return [1.0, bad, 0.0]

    with pytest.raises(ValueError, match="nan_reward.*at index 1"):
        call(nan_reward)


def test_non_number_is_an_error():
    with pytest.raises(TypeError, match="at index 0"):
        call(lambda c1, c2: ["good", 1.0, 2.0])


def test_tensor_and_numpy_returns():
    import numpy as np

    assert call(lambda c1, c2: torch.tensor([1.0, 2.0, 3.0])).tolist() == [1.0, 2.0, 3.0]
    assert call(lambda c1, c2: np.array([1.0, 2.0, 3.0])).tolist() == [1.0, 2.0, 3.0]


def test_per_agent_rewards_only_where_supported():
    def per_agent(c1, c2):
        return [[1.0, 2.0]] * 3

    with pytest.raises(ValueError, match="per-agent rewards"):
        call(per_agent)
    assert call(per_agent, allow_per_agent=True).shape == (3, 2)
    with pytest.raises(ValueError, match="need 2 floats"):
        call(lambda c1, c2: [[1.0]] * 3, allow_per_agent=True)


def test_processors():
    assert scale(2.0)(3.0) == 6.0
    assert shift(-1.0)(3.0) == 2.0
    assert clip(0.0, 1.0)(3.0) == 1.0
    assert compose(scale(2.0), shift(-1.0))(3.0) == 5.0  # left to right
    assert RewardProcessors.scale(10)(0.5) == 5.0
    fn = RewardFunction(lambda c1, c2: [1.0, 2.0, 3.0], 2, processor=compose(scale(2), shift(1)))
    processed, raw = fn([A, B])
    assert processed.tolist() == [3.0, 5.0, 7.0] and raw.tolist() == [1.0, 2.0, 3.0]


def test_processor_that_produces_nan_is_an_error():
    fn = RewardFunction(lambda c1, c2: [1.0, 0.0, 1.0], 2, processor=lambda r: math.nan if r == 0 else r)
    with pytest.raises(ValueError, match="reward_processor.*index 1"):
        fn([A, B])


def test_per_agent_rewards_are_one_tuple_per_joint_action_and_never_read_transposed():
    rf = RewardFunction(lambda c1, c2: list(zip([1.0, 2.0], [3.0, 4.0])), num_agents=2, allow_per_agent=True)
    assert rf.raw([["a", "b"], ["c", "d"]]).tolist() == [[1.0, 3.0], [2.0, 4.0]]  # J=2 rows of n=2
    # the same numbers as one list per agent: with J == n a list of lists reads both ways -> refused, never guessed
    columns = RewardFunction(lambda c1, c2: [[1.0, 2.0], [3.0, 4.0]], num_agents=2, allow_per_agent=True)
    with pytest.raises(ValueError, match="a list of lists reads both ways, so only tuples are taken"):
        columns.raw([["a", "b"], ["c", "d"]])
    # J != n: one list per agent is recognised as transposed
    three = RewardFunction(lambda c1, c2: [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], num_agents=2, allow_per_agent=True)
    with pytest.raises(ValueError, match=r"returned 2 lists of 3: .*looks transposed"):
        three.raw([["a", "b", "c"], ["d", "e", "f"]])
    # where the shape cannot be read both ways a list of lists is rows, as documented
    rows = RewardFunction(lambda c1, c2: [[1.0, 2.0]] * 3, num_agents=2, allow_per_agent=True)
    assert rows.raw([["a", "b", "c"], ["d", "e", "f"]]).shape == (3, 2)


def test_rewards_beyond_float32_safe_magnitude_are_refused():
    huge = RewardFunction(lambda c1, c2: [1e38] * len(c1), num_agents=2)
    with pytest.raises(ValueError, match=r"returned 1e\+38 at index 0; rewards must lie within \+-1e\+15"):
        huge.raw([["a"], ["b"]])
    scaled = RewardFunction(lambda c1, c2: [1.0] * len(c1), num_agents=2, processor=lambda r: r * 1e38)
    with pytest.raises(ValueError, match=r"reward_processor turned the reward .* into 1e\+38"):
        scaled([["a"], ["b"]])


def test_a_two_argument_reward_on_a_team_of_one_is_not_guessed():
    def two_agents(helper, coder):  # a 2-agent reward, but num_agents=1: (prompts, completions)? never guessed
        return [1.0] * len(helper)

    with pytest.raises(TypeError, match=r"takes 2 positional arguments with num_agents=1: .*set num_agents=2"):
        RewardFunction(two_agents, num_agents=1)

    def prompts_first(prompts, completions):
        return [float(p == "p" and c == "c") for p, c in zip(prompts, completions)]

    assert RewardFunction(prompts_first, num_agents=1).raw([["c"]], prompts=["p"]).tolist() == [1.0]
