"""Where a `--model` comes from (policy/sources.py) and how a model that does not load is reported."""

import shutil

import pytest

from harnessrl.policy import sources
from harnessrl.policy.sources import SourceError, check_model, converted, local_folder, preset_file
from tests.conftest import cli
from tests.train.test_sft import write_demos


def test_models_that_do_not_load_fail_naming_the_model_in_every_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path / "cache"))
    garbage = tmp_path / "garbage.gguf"
    garbage.write_text("not a model\n")
    config_only = tmp_path / "config-only"  # a config.json and nothing else: no tokenizer, no weights
    config_only.mkdir()
    (config_only / "config.json").write_text('{"model_type": "llama"}')
    write_demos(tmp_path / "demos.jsonl", n=1)
    for model, cause in [(garbage, "GGUF magic bytes"), (config_only, "does not load")]:
        for args in [
            ("save-model", tmp_path / "out", "--model", model),
            ("probe", "--model", model),
            ("sft", "--data", tmp_path / "demos.jsonl", "--out", tmp_path / "sft", "--model", model),
            ("registry", tmp_path / "registry", "--create", "m", "--model", model),
        ]:
            done = cli(*args)
            assert done.exit_code == 2 and f"--model {model}" in done.stderr and cause in done.stderr, (
                args,
                done.exit_code,
                done.stderr,
                done.exception,
            )
            shutil.rmtree(tmp_path / "registry", ignore_errors=True)
    assert not (tmp_path / "cache" / "models").exists() or not any((tmp_path / "cache" / "models").iterdir())


def test_a_model_folder_with_no_tokenizer_or_another_models_is_refused(tmp_path):
    from harnessrl.policy import PolicyLoadError
    from harnessrl.policy.model import load_model_and_tokenizer
    from harnessrl.policy.tiny import build_tokenizer

    no_tokenizer, other = tmp_path / "no-tokenizer", tmp_path / "other"
    shutil.copytree(sources.SHIPPED["tiny-base"], no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()  # transformers builds an empty tokenizer: every probe item scored 0
    with pytest.raises(PolicyLoadError, match="tokenizer encodes nothing"):
        load_model_and_tokenizer(str(no_tokenizer))
    shutil.copytree(sources.SHIPPED["tiny-base"], other)
    build_tokenizer(vocab_size=4096).save_pretrained(other)  # more tokens than the model embeds: an IndexError later
    with pytest.raises(PolicyLoadError, match="its model embeds"):
        load_model_and_tokenizer(str(other))


def test_check_model_resolves_names_without_loading_and_names_the_flag(tmp_path):
    for model in ("tiny", "tiny-base", "tiny-base-long", str(sources.SHIPPED["tiny-base"])):
        check_model(model)
    (tmp_path / "file.gguf").write_text("checked when loaded, not here")
    check_model(str(tmp_path / "file.gguf"))
    for model in ("tiny-bsae", str(tmp_path / "absent.gguf"), str(tmp_path)):
        with pytest.raises(SourceError, match="--model / model: .* is not one of tiny, tiny-base"):
            check_model(model)


def test_a_finished_gguf_conversion_removes_older_conversions_of_its_name_only(tmp_path, monkeypatch):
    try:
        gguf = preset_file("smollm2-135m-instruct")
    except SourceError:
        pytest.skip("the smollm2 preset wheel is not installed")
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path))
    models = tmp_path / "models"
    older = [models / "smollm2-0123456789", models / "smollm2-abcdef0123"]  # earlier installs' conversions
    kept = [
        models / "smollm2-0123456789.partial",  # another process's conversion under way
        models / "other-0123456789",  # another model's
        models / "smollm2-mine",  # not named by the cache
        models / "smollm2-0123456789-x",
    ]
    for folder in older + kept:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    folder = converted(gguf, "smollm2")
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert sorted(p.name for p in models.iterdir()) == sorted([folder.name, *(p.name for p in kept)])
    copies = [tmp_path / side / "model.gguf" for side in ("a", "b")]  # one file name in two places
    for copy in copies:
        copy.parent.mkdir()
        shutil.copyfile(gguf, copy)
    first, second = (local_folder(str(copy)) for copy in copies)
    assert first != second and (first / "config.json").is_file()  # the second did not remove the first's
