"""SFT on chat JSONL (loss on assistant turns) and the refusal of another tokenizer's ids."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from provrl.models import load_model, tokenizer_identity
from provrl.provenance import Identity, ProvenanceError
from provrl.train.chat_data import ChatDataError, chat_trajectory, load_chat_jsonl
from provrl.train.logprobs import check_tokenizer

CHATS = [
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Capital of France?"},
                  {"role": "assistant", "content": "Paris."},
                  {"role": "user", "content": "And of Italy?"},
                  {"role": "assistant", "content": "Rome."}]},
    {"id": "c2", "messages": [{"role": "user", "content": "2 + 2?"},
                              {"role": "assistant", "content": "4"}]},
]  # fmt: skip


@pytest.fixture
def chat_file(tmp_path):
    p = tmp_path / "chat.jsonl"
    p.write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    return p


def test_assistant_turns_are_the_actions_and_the_ids_are_the_templates(tokenizer, chat_file):
    trajs = load_chat_jsonl(chat_file, tokenizer)
    assert [t.traj_id for t in trajs] == ["chat:1", "c2"]
    t = trajs[0]
    acted = [
        tokenizer.decode(t.token_id[s.start : s.end]) for s in t.segments if s.kind == "action"
    ]
    assert acted == ["Paris.<|im_end|>", "Rome.<|im_end|>"]  # each turn learns to end itself
    # the whole trajectory is the chat template's rendering of the conversation
    want = tokenizer.apply_chat_template(CHATS[0]["messages"], tokenize=False)
    assert tokenizer.decode(t.token_id) == want
    assert t.policy.config["tokenizer"] == tokenizer_identity(tokenizer)
    assert (t.logprob[t.is_action] == 0).all() and t.reward == 1.0


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({"msgs": []}, r"chat.jsonl:1: expected an object with field 'messages'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, r"chat.jsonl:1: no assistant"),
        ({"messages": [{"role": "bot", "content": "x"}]}, r"'messages\[0\].role' is 'bot'"),
        ({"messages": [{"role": "user", "content": 3}]}, r"'messages\[0\].content' must be"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, r"assistant turn with no context"),
    ],
)
def test_bad_chat_records_name_file_line_and_field(tokenizer, tmp_path, record, match):
    p = tmp_path / "chat.jsonl"
    p.write_text(json.dumps(record) + "\n")
    with pytest.raises(ChatDataError, match=match):
        load_chat_jsonl(p, tokenizer)


def test_a_template_that_rewrites_history_is_refused(tokenizer):
    tok = copy.deepcopy(tokenizer)  # renders only the last two messages: history changes
    tok.chat_template = (
        "{% for m in messages[-2:] %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    msgs = CHATS[0]["messages"]
    with pytest.raises(ProvenanceError, match=r"messages\[2\]: the chat template re-renders"):
        chat_trajectory(tok, msgs, "x", Identity("chat"))


def test_traces_of_another_tokenizer_are_refused(tokenizer, chat_file):
    (t, _) = load_chat_jsonl(chat_file, tokenizer)
    mine = tokenizer_identity(tokenizer)
    check_tokenizer(t, mine)  # same tokenizer: fine
    other = copy.deepcopy(tokenizer)
    other.chat_template = "{{ messages[0]['content'] }}"
    theirs = tokenizer_identity(other)
    assert theirs["sha256"] != mine["sha256"]
    with pytest.raises(ProvenanceError, match=r"x.jsonl: trajectory 'chat:1' was tokenized by"):
        check_tokenizer(t, theirs, "x.jsonl")
    legacy = copy.copy(t)
    legacy.policy = Identity("old")  # logs written before tokenizers were recorded pass
    check_tokenizer(legacy, theirs)


def test_sft_refuses_traces_of_another_tokenizer(tokenizer, chat_file, tmp_path):
    from provrl.train.config import SFTConfig
    from provrl.train.sft import run_sft

    other = copy.deepcopy(tokenizer)
    other.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    traces = load_chat_jsonl(chat_file, other)  # tokenized by a tokenizer tiny does not use
    with pytest.raises(ProvenanceError, match="was tokenized by"):
        run_sft(traces, "tiny", tmp_path / "ck", SFTConfig(progress=False))
    assert not (tmp_path / "ck").exists()


def test_cli_sft_on_chat_jsonl_trains_the_assistant_turns(chat_file, tmp_path):
    from provrl.cli import app
    from provrl.models.checkpoint import read_metadata

    out = tmp_path / "ck"
    args = ["sft", "--data", str(chat_file), "--model", "tiny", "--out", str(out),
            "--epochs", "6", "--batch-size", "2", "--lr", "3e-2", "--warmup-steps", "0",
            "--schedule", "constant",
            "--selection", "all", "--json"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["traces_loaded"] == 2 and s["steps"] == 6
    assert s["last_loss"] < 0.5 * s["first_loss"]  # it learns the answers
    n_act = sum(t.num_actions for t in load_chat_jsonl(chat_file, load_model("tiny").tokenizer))
    assert s["action_tokens"] == 6 * n_act
    assert (tmp_path / "ck-run" / "sft_loss.png").stat().st_size > 1000
    assert read_metadata(out)["tokenizer"] == load_model("tiny").tokenizer_identity
