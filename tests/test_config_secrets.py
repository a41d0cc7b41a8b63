"""One place decides what is secret (`trl_marl.utils.secrets`); configs refuse secrets at construction and nothing
that slips through reaches a file under output_dir, a log or a model card."""

import logging
import sys
from pathlib import Path

import pytest

from trl_marl import MADPOIterConfig
from trl_marl.utils.secrets import find_secrets, is_secret_name, redact_secrets

SECRET = "sk-planted-0123456789abcdef"


@pytest.mark.parametrize(
    "name", ["Authorization", "X-Api-Key", "X-Auth-Token", "Api-Key", "Cookie", "api_key", "apiKey", "access_token"]
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["max_tokens", "max_output_tokens", "Content-Type", "temperature", "model", "store"])
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_find_and_redact():
    url = f"https://user:{SECRET}@api.example.com/v1?api-key={SECRET}&version=2"
    found = find_secrets(url, {"X-Auth-Token": SECRET, "X-Trace": "t"}, {"nested": {"client_secret": SECRET}})
    assert [v for _, v in found] == [SECRET] * 4
    red = redact_secrets({"url": url, "headers": {"Cookie": SECRET}, "body": [{"token": SECRET}]})
    assert SECRET not in repr(red) and "version=2" in red["url"] and red["headers"]["Cookie"] == "***"


@pytest.mark.parametrize(
    "options,where",
    [
        ({"headers": {"X-Auth-Token": SECRET}}, "the header 'X-Auth-Token'"),
        (f'{{"headers": {{"Authorization": "Bearer {SECRET}"}}}}', "the header 'Authorization'"),
        ({"url": f"https://api.example.com/v1?api-key={SECRET}"}, "the URL query parameter 'api-key'"),
        ({"extra_body": {"api_key": SECRET}}, "the extra_body field 'api_key'"),
    ],
)
def test_config_refuses_secrets_at_construction(tmp_path, options, where):
    """Whatever the comparator: a secret in `comparator_kwargs` fails the config (a JSON string as well)."""
    with pytest.raises(ValueError, match=r"environment variable named by comparator_kwargs\['key_env'\]") as err:
        MADPOIterConfig(output_dir=str(tmp_path), comparator_policy="current", comparator_kwargs=options)
    assert where in str(err.value) and SECRET not in str(err.value)


def test_planted_secret_reaches_no_file_log_or_card(tmp_path, tiny_path, caplog, capsys):
    """Secrets set AFTER construction (past the config's check) are redacted from team.json, every model card,
    training_args.bin, checkpoints and logs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
    import resume_run

    out = tmp_path / "run"
    t = resume_run.build("madpoiter", str(out), tiny_path, num_rounds=1)
    t.args.comparator_kwargs = {
        "url": f"https://user:{SECRET}@api.example.com/v1?api-key={SECRET}",
        "headers": {"X-Auth-Token": SECRET},
        "extra_body": {"api_key": SECRET, "max_tokens": 5},
    }
    with caplog.at_level(logging.DEBUG):
        t.train()
        t.save_model(str(out))
        t.create_model_card(model_name="team")
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "training_args.bin" for p in files) and any(p.name == "team.json" for p in files)
    assert any(p.name == "README.md" for p in files)
    for p in files:
        assert SECRET.encode() not in p.read_bytes(), p
    captured = capsys.readouterr()
    assert SECRET not in caplog.text and SECRET not in captured.out and SECRET not in captured.err
    assert "***" in (out / "team.json").read_text()  # the field is there, redacted
