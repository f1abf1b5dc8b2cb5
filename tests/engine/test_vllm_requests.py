"""The vLLM backend's side of the conversation with vLLM, pinned without vLLM: exactly what
:class:`~provrl.engine.vllm_backend.VLLMEngine` asks vLLM for, and how it reads vLLM's answers
into provenance.

vLLM is not installable in CI's venv (tests/engine/test_vllm_backend.py skips there), so
these tests put a scripted stand-in for vLLM 0.32's ``AsyncLLM`` under the ``vllm`` module
names the backend imports. The stand-in records every call (engine arguments, sampling
parameters, prompts, hot-load calls) and streams the responses scripted below, written in the
shape vLLM 0.32 streams them with ``RequestOutputKind.DELTA`` (``outputs[0].token_ids``, one
``{token: Logprob}`` per token, the request's cumulative ``weight_versions`` spans,
``metrics.num_preemptions``). Nothing of the backend is replaced: it runs its own event loop,
staging, hot-load and provenance rules. What is pinned:

* engine arguments: ``logprobs_mode="processed_logprobs"`` (log q after temperature / top-k /
  top-p — the distribution sampled from), ``max_logprobs=0``, token ids in and out;
* per request: ``logprobs=0`` (the sampled token's own), ``detokenize=False``,
  ``ignore_eos`` with explicit stop ids, DELTA output, the prompt salted with the weight
  version at submission (``cache_salt = provrl-v{v}``);
* the reading: per-token versions from the spans (a keep hot-load mid-request gives a
  mixed-version turn), log q = the processed logprob, kept mass 1 / NaN (truncated) / e^lp
  (greedy, log q 0), kv_min = the salt version unless vLLM preempted across a swap;
* a keep hot-load: ``pause_generation(mode="keep", clear_cache=False)``, ``reload_weights``
  from a staged safetensors file, the tied head re-tied, ``update_weight_version``, resume.
"""

from __future__ import annotations

import asyncio
import importlib.machinery
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from provrl.engine import EngineConfig
from provrl.provenance import UNKNOWN_VERSION, SamplingParams


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float


@dataclass
class Span:  # vllm.outputs.WeightVersionSpan
    version: str
    start: int
    end: int


@dataclass
class Chunk:
    """One streamed DELTA output: new tokens with their processed logprobs; on the last one
    the request's finish and its weight-version spans over all its tokens."""

    tokens: list[int]
    logprobs: list[float]
    spans: list[tuple[int, int, int]] = field(default_factory=list)
    finish: str | None = None
    preemptions: int = 0
    wait_for_swap: bool = False  # hold this chunk until a hot-load has resumed generation


def output(c: Chunk) -> Any:
    comp = types.SimpleNamespace(
        token_ids=c.tokens,
        logprobs=[{t: Logprob(lp)} for t, lp in zip(c.tokens, c.logprobs, strict=True)],
        weight_versions=[Span(str(v), a, b) for v, a, b in c.spans] or None,
        finish_reason=c.finish,
        stop_reason=None,
    )
    metrics = types.SimpleNamespace(num_preemptions=c.preemptions, queued_ts=0.0,
                                    scheduled_ts=0.0, first_token_ts=0.0, last_token_ts=0.0)  # fmt: skip
    return types.SimpleNamespace(outputs=[comp], finished=c.finish is not None, metrics=metrics,
                                 num_cached_tokens=0)  # fmt: skip


class FakeAsyncLLM:
    """vLLM 0.32's AsyncLLM as the backend uses it, recording every call."""

    instance: FakeAsyncLLM | None = None

    def __init__(self, engine_args: dict[str, Any]) -> None:
        self.engine_args = engine_args
        self.calls: list[tuple[Any, ...]] = []
        self.requests: list[dict[str, Any]] = []
        self.script: list[list[Chunk]] = []
        self.errored = False
        self.resumed: asyncio.Event | None = None
        self.renderer = types.SimpleNamespace(render_cmpl_async=self._render)
        FakeAsyncLLM.instance = self

    @classmethod
    def from_engine_args(cls, args: Any) -> FakeAsyncLLM:
        return cls(dict(args.kwargs))

    async def _render(self, prompts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(p) for p in prompts]

    async def generate(self, prompt: dict[str, Any], sp: Any, vid: str):
        self.requests.append({"prompt": prompt, "sampling": dict(sp.kwargs), "id": vid})
        for chunk in self.script.pop(0):
            if chunk.wait_for_swap:
                self.resumed = self.resumed or asyncio.Event()
                await self.resumed.wait()
            yield output(chunk)

    async def abort(self, vid: str) -> None:
        self.calls.append(("abort", vid))

    async def update_weight_version(self, v: str) -> None:
        self.calls.append(("update_weight_version", v))

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.calls.append(("pause_generation", mode, clear_cache))

    async def collective_rpc(self, name: str, kwargs: dict[str, Any] | None = None) -> None:
        self.calls.append(("collective_rpc", name, sorted(kwargs or {})))

    async def resume_generation(self) -> None:
        self.calls.append(("resume_generation",))
        self.resumed = self.resumed or asyncio.Event()
        self.resumed.set()

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))


class Recorded:
    """vllm.SamplingParams / AsyncEngineArgs: keeps the keyword arguments it was given."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@pytest.fixture
def fake_vllm(monkeypatch):
    """The module names the backend imports, backed by the stand-in."""

    def module(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        for k, v in attrs.items():
            setattr(m, k, v)
        monkeypatch.setitem(sys.modules, name, m)
        return m

    module("vllm", SamplingParams=Recorded)
    module("vllm.sampling_params", RequestOutputKind=types.SimpleNamespace(DELTA="DELTA"))
    module("vllm.inputs", TokensPrompt=dict)
    module("vllm.engine")
    module("vllm.engine.arg_utils", AsyncEngineArgs=Recorded)
    module("vllm.platforms", current_platform=types.SimpleNamespace(is_cpu=lambda: True))
    module("vllm.v1")
    module("vllm.v1.engine")
    module("vllm.v1.engine.async_llm", AsyncLLM=FakeAsyncLLM)
    return FakeAsyncLLM


@pytest.fixture
def engine(fake_vllm, tiny):
    from provrl.engine.vllm_backend import VLLMEngine

    cfg = EngineConfig(backend="vllm", max_seqs=4, max_context=128, seed=3)
    with VLLMEngine(tiny, cfg) as e:
        yield e, fake_vllm.instance


PROMPT = [1, 504, 3203, 335, 253]


def test_engine_arguments_ask_for_the_processed_logprobs(engine):
    _e, llm = engine
    args = llm.engine_args
    assert args["logprobs_mode"] == "processed_logprobs" and args["max_logprobs"] == 0
    assert args["skip_tokenizer_init"] is True and args["generation_config"] == "vllm"
    assert args["enable_prefix_caching"] is True and args["max_model_len"] == 128
    assert args["dtype"] == "float32" and args["seed"] == 3 and args["enforce_eager"] is True
    assert args["worker_extension_cls"] == "provrl.engine.vllm_backend.WorkerExtension"
    assert llm.calls[0] == ("update_weight_version", "0")  # stamped before any request


def test_a_truncated_turn_records_the_processed_logprob_and_an_unknown_mass(engine):
    e, llm = engine
    lps = [-0.25, -1.5, -0.125]
    llm.script.append([Chunk([11, 12], lps[:2]), Chunk([13], lps[2:], [(0, 0, 3)], "length")])
    p = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, max_new_tokens=3, seed=5)
    out = e.submit(PROMPT, p).result(30)
    (req,) = llm.requests
    sp = req["sampling"]
    assert req["prompt"] == {"prompt_token_ids": PROMPT, "cache_salt": "provrl-v0"}
    assert (sp["temperature"], sp["top_p"], sp["top_k"], sp["max_tokens"]) == (0.7, 0.9, 50, 3)
    assert sp["logprobs"] == 0 and sp["detokenize"] is False and sp["output_kind"] == "DELTA"
    assert sp["ignore_eos"] is True and sp["stop_token_ids"] == [2]  # the tokenizer's EOS
    assert sp["skip_special_tokens"] is False and isinstance(sp["seed"], int)
    assert out.token_ids == [11, 12, 13] and out.finish_reason == "length"
    np.testing.assert_array_equal(out.logprob, np.float32(lps))  # log q as vLLM processed it
    assert np.isnan(out.kept_mass).all()  # vLLM does not return the mass top-p cut
    assert out.version.tolist() == [0, 0, 0] and out.kv_min.tolist() == [0, 0, 0]


def test_greedy_and_untruncated_follow_the_local_engines_conventions(engine):
    e, llm = engine
    llm.script += [[Chunk([7, 8], [-0.5, -0.75], [(0, 0, 2)], "length")]] * 2
    greedy = e.submit(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=2)).result(30)
    assert greedy.logprob.tolist() == [0.0, 0.0]  # q is a point mass
    np.testing.assert_allclose(greedy.kept_mass, np.exp([-0.5, -0.75]), rtol=1e-6)
    plain = e.submit(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=2)).result(30)
    assert plain.logprob.tolist() == [-0.5, -0.75] and plain.kept_mass.tolist() == [1.0, 1.0]


def test_a_keep_hot_load_mid_turn_gives_the_spans_versions_and_the_salt_as_kv_min(engine, tiny):
    e, llm = engine
    llm.script.append([
        Chunk([21, 22], [-1.0, -2.0]),
        Chunk([23, 24], [-0.5, -0.25], [(0, 0, 2), (1, 2, 4)], "length", wait_for_swap=True),
    ])  # fmt: skip
    seen = threading.Event()
    fut = e.submit(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=4),
                   on_token=lambda _rid, _tok: seen.set())  # fmt: skip
    assert seen.wait(30)  # the first tokens are out: the turn is in flight
    sd = {k: v.detach().clone() for k, v in tiny.model.state_dict().items()}
    report = e.load_weights(sd, 1, "keep")
    out = fut.result(30)
    assert report.mode == "keep" and (report.old_version, report.new_version) == (0, 1)
    assert llm.calls[1:] == [
        ("pause_generation", "keep", False),  # in-flight requests frozen, their KV kept
        ("collective_rpc", "reload_weights", ["weights_path"]),
        ("collective_rpc", "provrl_retie_lm_head", []),  # tiny ties its head
        ("update_weight_version", "1"),
        ("resume_generation",),
    ]
    assert out.version.tolist() == [0, 0, 1, 1]  # a mixed-version turn, read from the spans
    assert out.kv_max.tolist() == [0, 0, 1, 1]
    assert out.kv_min.tolist() == [0] * 4  # salted at v0: every KV block it used is ≥ v0
    assert e.version == 1
    # the next turn of the conversation is salted with the new version
    llm.script.append([Chunk([31], [-0.5], [(1, 0, 1)], "length")])
    nxt = e.submit_continue(out.request_id, [5, 6], SamplingParams(max_new_tokens=1)).result(30)
    assert llm.requests[-1]["prompt"]["cache_salt"] == "provrl-v1"
    assert llm.requests[-1]["prompt"]["prompt_token_ids"] == [*PROMPT, 21, 22, 23, 24, 5, 6]
    assert nxt.version.tolist() == [1] and nxt.kv_min.tolist() == [1]


def test_a_preemption_across_a_swap_makes_kv_min_unknown(engine, tiny):
    e, llm = engine
    llm.script.append([
        Chunk([41], [-1.0]),
        Chunk([42], [-1.0], [(0, 0, 1), (1, 1, 2)], "length", preemptions=1, wait_for_swap=True),
    ])  # fmt: skip
    seen = threading.Event()
    fut = e.submit(PROMPT, SamplingParams(temperature=1.0, max_new_tokens=2),
                   on_token=lambda _rid, _tok: seen.set())  # fmt: skip
    assert seen.wait(30)
    e.load_weights({k: v.detach().clone() for k, v in tiny.model.state_dict().items()}, 1, "keep")
    out = fut.result(30)
    assert out.version.tolist() == [0, 1]
    assert out.kv_min.tolist() == [UNKNOWN_VERSION] * 2  # recomputed: maybe with v1 KV
    assert e.stats()["kv_unknown_tokens"] == 2
