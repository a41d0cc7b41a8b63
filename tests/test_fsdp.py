"""trl_marl.distributed.fsdp without processes: unsupported FSDP settings fail early with the field's name; the units a team
is cut into; FSDP stays off unless the launcher asked for it."""

from types import SimpleNamespace

import pytest
from accelerate.utils import DistributedType
from transformers import AutoModelForCausalLM

from trl_marl.distributed.fsdp import _layer_classes, check_fsdp2_plugin, enable_fsdp_on_cpu, fsdp_units
from trl_marl.models.team import TeamModel


def _acc(**plugin):
    base = dict(fsdp_version=2, cpu_ram_efficient_loading=False, state_dict_type="StateDictType.FULL_STATE_DICT")
    return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=SimpleNamespace(**{**base, **plugin})))


@pytest.mark.parametrize(
    "plugin, field",
    [
        ({"fsdp_version": 1}, "fsdp_version"),
        ({"cpu_ram_efficient_loading": True}, "fsdp_cpu_ram_efficient_loading"),
        ({"state_dict_type": "StateDictType.SHARDED_STATE_DICT"}, "fsdp_state_dict_type"),
    ],
)
def test_unsupported_settings_fail_naming_the_field(plugin, field):
    with pytest.raises(ValueError, match=field):
        check_fsdp2_plugin(_acc(**plugin))
    check_fsdp2_plugin(_acc())  # the shipped settings pass


def test_units_are_agents_and_decoder_layers(tiny_path):
    agents = [AutoModelForCausalLM.from_pretrained(tiny_path) for _ in range(2)]
    team = TeamModel(agents)
    assert fsdp_units(team) == agents
    layers = [m for m in agents[0].modules() if isinstance(m, tuple(_layer_classes(agents[0])))]
    assert len(layers) == agents[0].config.num_hidden_layers


def test_fsdp_on_cpu_only_when_launched_with_fsdp(monkeypatch):
    state = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, fsdp_plugin=None)
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert enable_fsdp_on_cpu(SimpleNamespace(state=state)) is False
    assert state.distributed_type == DistributedType.MULTI_CPU and state.fsdp_plugin is None
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    gpu_state = SimpleNamespace(distributed_type=DistributedType.MULTI_GPU, fsdp_plugin=None)
    assert enable_fsdp_on_cpu(SimpleNamespace(state=gpu_state)) is False  # accelerate's own path on GPUs
