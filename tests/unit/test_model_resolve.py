"""Model resolution is offline: local dirs, the bundled model, and clear errors otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from ajet.models.resolve import ModelNotFoundError, resolve_model_path


def test_local_checkpoint_dir_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == tmp_path


def test_dir_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_hub_id_not_in_cache_gives_offline_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="never downloads"):
        resolve_model_path("some-org/some-model-that-is-not-here")


def test_nonexistent_path_names_the_bundled_alternative() -> None:
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-instruct"):
        resolve_model_path("./no/such/dir")


def test_converting_the_bundled_gguf_parses_it_once_and_restores_gguf() -> None:
    import gguf

    from ajet.models import resolve

    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    path = resolve.bundled_gguf()
    with resolve._gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # one parse, whatever the path's type
        assert isinstance(first, real_reader) and len(first.tensors) == 272
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 30) is gguf.get_tensor_name_map(arch, 30)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_name_map)
    assert gguf.get_tensor_name_map(arch, 30) is not gguf.get_tensor_name_map(arch, 30)


def test_the_once_parsed_reader_reads_what_gguf_reads() -> None:
    """Its header is parsed from a plain ndarray view of the mapping, not from np.memmap."""
    import gguf
    import numpy as np

    from ajet.models import resolve

    path = resolve.bundled_gguf()
    real = gguf.GGUFReader(path)
    with resolve._gguf_parsed_once():
        fast = gguf.GGUFReader(path)
    assert type(fast.data) is np.ndarray and isinstance(real.data, np.memmap)
    assert list(fast.fields) == list(real.fields)
    for name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "llama.context_length"):
        ours, theirs = fast.fields[name], real.fields[name]
        assert ours.types == theirs.types
        assert [bytes(p) for p in ours.parts] == [bytes(p) for p in theirs.parts]
    assert [(t.name, t.tensor_type, t.data_offset) for t in fast.tensors] == \
        [(t.name, t.tensor_type, t.data_offset) for t in real.tensors]
    assert np.array_equal(fast.tensors[0].data, real.tensors[0].data)


def test_the_bundled_tokenizer_is_built_right(bundled_model_dir: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from ajet.models.resolve import tokenizer_problems

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    assert (tokenizer.eos_token, tokenizer.bos_token) == ("<|im_end|>", "<|im_start|>")
    assert tokenizer_problems(tokenizer, AutoConfig.from_pretrained(bundled_model_dir)) == []


def test_a_tokenizer_that_adds_a_bos_is_found_by_its_round_trip(bundled_model_dir: Path) -> None:
    """transformers 4.x put <|im_start|> before every text of this GGUF's tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    from ajet.models.resolve import tokenizer_problems

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    tokenizer.add_bos_token = True
    (problem,) = tokenizer_problems(tokenizer, AutoConfig.from_pretrained(bundled_model_dir))
    assert problem.startswith("it decodes ") and "encoded as '<|im_start|>Hi there" in problem


def test_a_tokenizer_built_wrong_is_refused_and_nothing_is_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bundled_model_dir: Path) -> None:
    """What transformers 5.10-5.17 build from the bundled GGUF (verl's environment has 5.10): EOS
    <|im_start|>. Cached, it poisoned every later run and environment (the model never stopped)."""
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    from ajet.errors import SetupError
    from ajet.models import resolve

    wrong = AutoTokenizer.from_pretrained(bundled_model_dir)
    wrong.eos_token = "<|im_start|>"

    class Model:
        config = AutoConfig.from_pretrained(bundled_model_dir)

        def save_pretrained(self, out_dir: Path) -> None:
            raise AssertionError("a model with a wrong tokenizer was saved")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: wrong)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *args, **kwargs: Model())
    with pytest.raises(SetupError, match=r"transformers \S+ builds the bundled model's tokenizer wrongly from "
                                         r"\S+\.gguf: its EOS is '<\|im_start\|>' \(id 1\), the model's is "
                                         r"'<\|im_end\|>' \(id 2\)\. Nothing was written.*transformers>=5\.18"):
        resolve.bundled_checkpoint(str(tmp_path))
    target = resolve.bundled_target(str(tmp_path))
    assert [p.name for p in target.parent.iterdir()] == [f".{target.name}.lock"]  # no checkpoint, no leftover
