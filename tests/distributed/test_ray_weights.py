"""Weights across processes (pack/unpack), the backend's config fields and the local switch
— no Ray needed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from provrl.config import ConfigError, load_config
from provrl.distributed.weights import pack_state_dict, unpack_state_dict
from provrl.run_config import RunConfig


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pack_unpack_is_bit_exact_in_every_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    sd = {"a.weight": torch.randn(4, 3, generator=g).to(dtype), "b.bias": torch.randn(5).to(dtype)}
    packed = pack_state_dict(sd)
    assert all(isinstance(a, np.ndarray) for a in packed.arrays.values())
    assert packed.nbytes == sum(t.numel() * t.element_size() for t in sd.values())
    back = unpack_state_dict(packed)
    for k, t in sd.items():
        assert back[k].dtype == dtype and back[k].shape == t.shape
        assert torch.equal(back[k].view(torch.uint8), t.view(torch.uint8))  # bit for bit


def test_pack_shares_memory_and_unpack_reads_read_only_arrays():
    t = torch.arange(6, dtype=torch.float32)
    packed = pack_state_dict({"w": t})
    t[0] = 42.0  # packing is a view: ray.put is what copies, once
    assert packed.arrays["w"][0] == 42.0
    packed.arrays["w"].setflags(write=False)  # how the object store hands arrays out
    assert unpack_state_dict(packed)["w"][0].item() == 42.0


def test_pack_refuses_a_non_tensor_naming_the_key():
    with pytest.raises(TypeError, match="'w' is a list"):
        pack_state_dict({"w": [1.0, 2.0]})


def test_backend_and_ray_section_in_the_run_config():
    cfg = load_config(RunConfig, "quick", ["backend=ray", "ray.replicas=3", "ray.schedule=all"])
    assert cfg.backend == "ray" and cfg.ray.replicas == 3 and cfg.ray.schedule == "all"
    assert load_config(RunConfig, "quick", []).backend == "local"
    with pytest.raises(ConfigError, match=r"ray\.schedule"):
        load_config(RunConfig, "quick", ["ray.schedule=sometimes"])
    with pytest.raises(ConfigError, match="backend"):
        load_config(RunConfig, "quick", ["backend=spark"])


def test_backend_local_builds_the_in_process_engine(tiny):
    from provrl.engine import EngineConfig, LocalEngine
    from provrl.pipeline.engines import make_rollout_engine

    small = EngineConfig(max_seqs=2, max_context=64)
    engine = make_rollout_engine(tiny, RunConfig(), small, version=3)
    try:
        assert isinstance(engine, LocalEngine) and engine.version == 3
    finally:
        engine.close()


def test_backend_local_builds_what_engine_backend_names(tiny):
    """The local switch goes through the engine factory: ``engine.backend: vllm`` asks for
    vLLM (here: refused with the extra to install when vLLM is absent)."""
    import importlib.util

    from provrl.engine import EngineConfig, EngineError
    from provrl.pipeline.engines import make_rollout_engine

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed: its engine is tested in tests/engine")
    with pytest.raises(EngineError, match=r"engine\.backend=vllm: vLLM is not installed"):
        make_rollout_engine(tiny, RunConfig(), EngineConfig(backend="vllm", max_context=64))


def test_backend_ray_without_ray_fails_with_one_line_naming_the_extra(tiny, monkeypatch):
    import importlib.util
    import sys

    from provrl.extras import MissingExtra
    from provrl.pipeline.engines import make_rollout_engine

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a)
    )
    with pytest.raises(MissingExtra, match=r"backend: ray needs ray.*pip install 'provrl\[ray\]'"):
        make_rollout_engine(tiny, RunConfig(backend="ray"))
