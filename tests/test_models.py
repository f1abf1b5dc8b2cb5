"""Model loading by name, chat ids, safetensors checkpoints, corrupt-file errors."""

from __future__ import annotations

import pytest
import torch

from provrl.models import (
    CheckpointError,
    chat_ids,
    continuation_ids,
    load_model,
    load_state_dict,
    save_checkpoint,
    stop_token_ids,
)
from provrl.models.checkpoint import read_metadata


def test_tiny_is_a_real_llama_with_the_smollm2_tokenizer(tiny):
    assert tiny.model.config.model_type == "llama"
    assert tiny.model.config.vocab_size == len(tiny.tokenizer) == 49152
    ids = chat_ids(tiny.tokenizer, [{"role": "user", "content": "hello"}])
    assert ids[-3:] == tiny.tokenizer.encode("<|im_start|>assistant\n")[-3:]
    with torch.no_grad():
        logits = tiny.model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 49152) and torch.isfinite(logits).all()


def test_tiny_is_deterministic_given_seed():
    a, b, c = load_model("tiny", seed=1), load_model("tiny", seed=1), load_model("tiny", seed=2)
    wa, wb, wc = (m.model.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_chat_helpers(tokenizer):
    assert 2 in stop_token_ids(tokenizer)  # <|im_end|>
    ids = continuation_ids(tokenizer, "user", "<result>x</result>")
    toks = tokenizer.convert_ids_to_tokens(ids)
    assert toks[0] == "<|im_end|>" and toks[-3:] == ["ass", "istant", "Ċ"]


def test_checkpoint_round_trip_is_loadable_by_transformers(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    path = save_checkpoint(tiny.model, tiny.tokenizer, tmp_path / "ckpt", version=3, step=10)
    assert (path / "model.safetensors").exists() and read_metadata(path)["version"] == 3
    hf = AutoModelForCausalLM.from_pretrained(path)
    ours = load_model(str(path))
    for m in (hf, ours.model):
        for (k, v), (_, w) in zip(
            tiny.model.state_dict().items(), m.state_dict().items(), strict=True
        ):
            assert torch.equal(v, w), k
    assert ours.fingerprint.startswith("sha256:")


def test_corrupt_checkpoint_names_the_file(tiny, tmp_path):
    path = save_checkpoint(tiny.model, None, tmp_path / "ckpt")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt"):
        load_model(str(path))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt"):
        load_state_dict(weights)
    with pytest.raises(FileNotFoundError, match="not a known name"):
        load_model(str(tmp_path / "missing"))


def test_pickles_are_loaded_weights_only(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    p = tmp_path / "evil.pt"
    torch.save({"w": Evil()}, p)
    with pytest.raises(CheckpointError, match="weights-only"):
        load_state_dict(p)
    good = tmp_path / "good.pt"
    torch.save({"w": torch.ones(2)}, good)
    assert torch.equal(load_state_dict(good)["w"], torch.ones(2))


@pytest.mark.slow
def test_smollm2_loads_from_the_cache_and_answers():
    lm = load_model("smollm2-135m")
    assert sum(p.numel() for p in lm.model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    ids = chat_ids(lm.tokenizer, [{"role": "user", "content": "What is the capital of France?"}])
    out = lm.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "Paris" in lm.tokenizer.decode(out[0, len(ids) :])


MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
# Qwen3's habit: an assistant turn after the last user turn gets an (empty) think block, so
# adding a turn re-renders the earlier one — the second way turn_template reads the template
QWEN3_LIKE_TEMPLATE = (
    "{% set ns = namespace(last=0) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' and loop.index0 > ns.last %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{{ m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize("template", [None, MISTRAL_TEMPLATE, QWEN3_LIKE_TEMPLATE])
@pytest.mark.parametrize("ended", [False, True])
def test_continuation_follows_the_tokenizers_own_chat_template(tokenizer, template, ended):
    """prompt ids + the model's turn + continuation ids decode to exactly the text the chat
    template renders for the whole conversation, for ChatML, Mistral and Qwen3-style
    templates, whether or not the turn already ended with its stop token."""
    import copy

    from provrl.models.chat import turn_template

    tok = copy.deepcopy(tokenizer)
    if template is not None:
        tok.chat_template = template
    q, answer, obs = "Who?", "<search>Halvex</search>", "<information>x</information>"
    turn = tok.encode(answer, add_special_tokens=False)
    if ended:
        turn += [tok.eos_token_id]
    ids = chat_ids(tok, [{"role": "user", "content": q}])
    ids += turn + continuation_ids(tok, "user", obs, close_assistant=not ended)
    want = tok.apply_chat_template(
        [{"role": "user", "content": q}, {"role": "assistant", "content": answer},
         {"role": "user", "content": obs}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    assert tok.decode(ids, skip_special_tokens=False) == want
    if template == MISTRAL_TEMPLATE:
        assert turn_template(tok, "user").before == "[INST] "


def test_a_template_that_cannot_add_the_turn_is_named(tokenizer):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = MISTRAL_TEMPLATE
    with pytest.raises(ValueError, match=r"chat template cannot render a 'tool' turn"):
        continuation_ids(tok, "tool", "x")


def test_checkpoints_are_portable_and_readable_by_others(tiny, tmp_path):
    """transformers 4.x cannot load ``tokenizer_class: TokenizersBackend`` (5.x's name) and
    reads ``rope_theta``, not ``rope_parameters``; mkdtemp and safetensors write 0700/0600.
    (Loading this checkpoint under transformers 4.57.3 was checked by hand: identical ids
    and logits; docs/data.md.)"""
    import json
    import os
    import stat

    from provrl.models import tokenizer_identity

    path = save_checkpoint(tiny.model, tiny.tokenizer, tmp_path / "ckpt")
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_cfg["chat_template"] == tiny.tokenizer.chat_template
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 10000.0
    assert cfg["torch_dtype"] == "float32"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~umask
    for f in path.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f.name
    assert read_metadata(path)["tokenizer"] == tokenizer_identity(tiny.tokenizer)
    again = load_model(str(path))  # and transformers 5 reads it back the same
    assert again.tokenizer_identity["sha256"] == tokenizer_identity(tiny.tokenizer)["sha256"]
    assert again.model.config.rope_parameters["rope_theta"] == 10000.0
