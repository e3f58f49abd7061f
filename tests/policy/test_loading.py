"""Where a `--model` comes from (policy/sources.py) and how a model that does not load is reported."""

import os
import shutil
import threading
import time

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
    # one file name in two places: naming, not converting, so a fake conversion (a real one took 25-50 s)
    monkeypatch.setattr(sources, "_convert", lambda src, out: (out.mkdir(parents=True), (out / "config.json").touch()))
    copies = [tmp_path / side / "model.gguf" for side in ("a", "b")]
    for copy in copies:
        copy.parent.mkdir()
        copy.write_bytes(b"GGUF")
    first, second = (local_folder(str(copy)) for copy in copies)
    assert first != second and (first / "config.json").is_file()  # the second did not remove the first's


def _llama_folder(folder, shard: str = "40KB"):
    """A 2-layer Llama (untied embeddings) with the tiny tokenizer, saved in safetensors shards."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from harnessrl.policy.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder, max_shard_size=shard)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_model_folder_missing_weights_or_with_a_cut_file_is_refused_naming_what(tmp_path):
    from safetensors.torch import load_file, save_file

    from harnessrl.policy import PolicyLoadError
    from harnessrl.policy.model import load_model_and_tokenizer

    model = _llama_folder(tmp_path / "llama")
    lm, _ = load_model_and_tokenizer(str(model))  # whole: loads, every shard's weights in place
    shards = sorted(model.glob("model-*.safetensors"))
    assert len(shards) > 2 and type(lm).__name__ == "LlamaForCausalLM"

    def broken(name: str, change) -> str:
        folder = tmp_path / name
        shutil.copytree(model, folder)
        change(folder)
        with pytest.raises(PolicyLoadError) as refused:
            load_model_and_tokenizer(str(folder))
        assert str(refused.value).startswith(f"--model {folder}: ")
        return str(refused.value)

    def cut(file):
        file.write_bytes(file.read_bytes()[: file.stat().st_size * 9 // 10])

    def drop_a_tensor(folder):  # a partial save: transformers would start the tensor at random, logging only
        shard = folder / shards[1].name
        weights = load_file(shard)
        save_file(dict(list(weights.items())[1:]), shard, metadata={"format": "pt"})
        return next(iter(weights))

    lacking = tmp_path / "lacking"
    shutil.copytree(model, lacking)
    missing = drop_a_tensor(lacking)
    with pytest.raises(PolicyLoadError, match=rf"weight files lack 1 of LlamaForCausalLM's tensors \({missing}\)"):
        load_model_and_tokenizer(str(lacking))
    assert f"{tmp_path / 'cut-shard' / shards[1].name} does not read" in broken(
        "cut-shard", lambda f: cut(f / shards[1].name)
    )
    assert f"{tmp_path / 'cut-tokenizer' / 'tokenizer.json'} is not valid JSON" in broken(
        "cut-tokenizer", lambda f: cut(f / "tokenizer.json")
    )
    # read as absent by transformers, losing its end-of-turn ids
    assert "generation_config.json is not valid JSON" in broken(
        "cut-generation", lambda f: cut(f / "generation_config.json")
    )
    # a Llama folder without tokenizer.json: transformers asks for sentencepiece; the file is named
    assert "it has no tokenizer.json" in broken("no-tokenizer", lambda f: (f / "tokenizer.json").unlink())


def test_a_lora_adapter_folder_is_refused_saying_what_to_pass_instead(tmp_path):
    import peft

    from harnessrl.policy import PolicyLoadError
    from harnessrl.policy.model import load_model_and_tokenizer
    from harnessrl.policy.tiny import build_tiny

    adapter = tmp_path / "adapter"  # what peft saves, and a harnessrl checkpoint's adapter/: no config.json
    peft.get_peft_model(build_tiny()[0], peft.LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter)
    with pytest.raises(
        SourceError, match=r"--model / model: .* holds a LoRA adapter, adapter_config.json, not a model"
    ):
        check_model(str(adapter))
    with pytest.raises(PolicyLoadError, match=rf"--model {adapter}: .* merged model, which a harnessrl checkpoint"):
        load_model_and_tokenizer(str(adapter))


def test_a_model_naming_no_context_length_is_refused_until_its_config_names_one(tmp_path):
    import json

    from transformers import BloomConfig, BloomForCausalLM

    from harnessrl.policy import Policy, PolicyLoadError, SamplingParams
    from harnessrl.policy.tiny import build_tokenizer

    tokenizer, bloom = build_tokenizer(), tmp_path / "bloom"  # ALiBi: no max_position_embeddings (a raw AttributeError)
    BloomForCausalLM(BloomConfig(vocab_size=len(tokenizer), hidden_size=32, n_layer=1, n_head=4)).save_pretrained(bloom)
    tokenizer.save_pretrained(bloom)
    with pytest.raises(PolicyLoadError, match=rf"--model {bloom}: {bloom / 'config.json'} has no max_position_embed"):
        Policy.load(str(bloom))
    config = json.loads((bloom / "config.json").read_text())
    (bloom / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 256}))
    policy = Policy.load(str(bloom))  # as the message says
    try:
        done = policy.engine.generate_sync([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
        assert policy.context == 256 and len(done.ids) == 4
    finally:
        policy.close()


def test_two_processes_converting_one_gguf_file_leave_one_whole_conversion(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    first_half, second_half, first_done = threading.Event(), threading.Event(), threading.Event()

    def convert(src, out):  # save_pretrained's order: the config, the weights, then the tokenizer's files
        name = threading.current_thread().name
        for file in ("config.json", "model.safetensors", "tokenizer.json"):
            out.mkdir(parents=True, exist_ok=True)
            (out / file).write_text(name)
            if name == "first" and file == "model.safetensors":  # the second starts while the first is half done...
                first_half.set()
                assert second_half.wait(timeout=60)
            if name == "second" and file == "config.json":  # ...and ends after the first's was renamed into place
                second_half.set()
                assert first_done.wait(timeout=60)

    def run(done: threading.Event | None = None):
        results[threading.current_thread().name] = converted(gguf, "m")
        if done is not None:
            done.set()

    monkeypatch.setattr(sources, "_convert", convert)
    results = {}
    first = threading.Thread(target=run, args=(first_done,), name="first")
    second = threading.Thread(target=run, name="second")
    first.start()
    assert first_half.wait(timeout=60)
    second.start()
    first.join(timeout=60)
    second.join(timeout=60)
    folder = results["first"]
    assert results["second"] == folder and converted(gguf, "m") == folder
    files = {p.name: p.read_text() for p in folder.iterdir()}
    assert files == dict.fromkeys(["config.json", "model.safetensors", "tokenizer.json"], "first")  # one conversion's
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # the second's copy was removed


def test_a_partial_conversion_untouched_for_a_day_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(sources, "_convert", lambda src, out: out.mkdir(parents=True))
    folder = converted(gguf, "m")
    shutil.rmtree(folder)
    dead, running = (folder.with_name(f"{folder.name}.partial-{pid}-0123abcd") for pid in (1, 2))
    dead.mkdir()
    running.mkdir()
    os.utime(dead, (0, time.time() - sources.ABANDONED_SECONDS - 60))
    assert converted(gguf, "m") == folder
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted([folder.name, running.name])
