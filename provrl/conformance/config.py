"""What ``provrl conformance`` checks, with how many draws, at which level."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from provrl.config import Section
from provrl.provenance import SamplingParams

DEFAULT_SETTINGS: list[tuple[float, int, float]] = [
    (1.0, 0, 1.0),
    (0.7, 0, 0.9),
    (1.0, 20, 1.0),
    (0.5, 16, 0.8),
]
"""(temperature, top_k, top_p): plain sampling, a nucleus below T = 1, top-k, all three."""


class ConformanceConfig(Section):
    """Settings of one conformance run (docs/conformance.md)."""

    prompts: list[str] = Field(
        default_factory=lambda: ["What is the capital of France?", "Who wrote Hamlet?"],
        min_length=1,
        description="User messages, chat-templated: the fixed prefixes the law is tested at.",
    )
    settings: list[tuple[float, int, float]] = Field(
        default_factory=lambda: list(DEFAULT_SETTINGS),
        min_length=1,
        description="(temperature, top_k, top_p) of each tested law; temperature > 0.",
    )
    pilot: int = Field(
        100, ge=1, description="Draws per law that fix the cells (never tested themselves)."
    )
    samples: int = Field(500, ge=10, description="Draws per law that are tested.")
    alpha: float = Field(
        0.01, gt=0.0, lt=1.0, description="Family-wise false-alarm level of the law tests (Holm)."
    )
    effect: float = Field(
        0.25, gt=0.0, description="Cohen's w at which each law test's power is reported."
    )
    e_min: float = Field(5.0, gt=0.0, description="Smallest expected count of an own cell.")
    mass_tol: float = Field(
        1e-3, ge=0.0, description="How far above 1 the reported masses may add (rounding)."
    )
    logprob_tol: dict[str, float] = Field(
        default_factory=lambda: {"float32": 1e-3, "bfloat16": 5e-2, "float16": 2e-2},
        description="Largest |recorded − recomputed| log q per engine dtype (teacher forcing).",
    )
    modes: list[str] = Field(
        default_factory=lambda: ["keep", "recompute", "drain"],
        description="Hot-load modes whose stamps are checked, one weight swap each.",
    )
    stamps_setting: tuple[float, int, float] = Field(
        (1.0, 20, 1.0),
        description="(temperature, top_k, top_p) of the stamps check's turns: top-k, so a "
        "token can fall inside one version's support and outside another's.",
    )
    turn_tokens: int = Field(6, ge=2, description="Tokens per turn in the stamps check.")
    swap_after: int | None = Field(
        None,
        ge=1,
        description="The stamps check's mid-turn swap is published right after this many "
        "tokens of a turn (< turn_tokens; None: turn_tokens // 2).",
    )
    perturb: float = Field(
        0.5, gt=0.0, description="Each new version adds perturb·std·N(0, 1) to every tensor."
    )
    seed: int = Field(0, description="Seeds every draw and every published version.")

    @field_validator("settings")
    @classmethod
    def _positive_temperature(
        cls, v: list[tuple[float, int, float]]
    ) -> list[tuple[float, int, float]]:
        for s in v:
            cls._setting(s)
        return v

    @field_validator("stamps_setting")
    @classmethod
    def _stamps_setting(cls, v: tuple[float, int, float]) -> tuple[float, int, float]:
        return cls._setting(v)

    @staticmethod
    def _setting(s: tuple[float, int, float]) -> tuple[float, int, float]:
        t, k, p = s
        if not (t > 0 and k >= 0 and 0 < p <= 1):
            raise ValueError(
                f"setting ({t}, {k}, {p}): need temperature > 0, top_k ≥ 0, top_p in (0, 1]"
            )
        return s

    @field_validator("modes")
    @classmethod
    def _known_modes(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if m not in ("keep", "recompute", "drain")]
        if bad:
            raise ValueError(f"modes {bad}: each must be keep, recompute or drain")
        return v

    @model_validator(mode="after")
    def _swap_inside_turn(self) -> ConformanceConfig:
        if self.swap_after is not None and self.swap_after >= self.turn_tokens:
            raise ValueError(
                f"swap_after = {self.swap_after}: the mid-turn swap must land inside a turn of "
                f"turn_tokens = {self.turn_tokens} tokens (swap_after < turn_tokens)"
            )
        return self

    @property
    def swap_point(self) -> int:
        """Tokens of a turn sampled before the mid-turn swap (``swap_after`` resolved)."""
        return self.swap_after if self.swap_after is not None else self.turn_tokens // 2

    def params(self, setting: tuple[float, int, float], n: int, seed: int) -> SamplingParams:
        """The sampling parameters of one draw of ``n`` tokens under ``setting``."""
        t, k, p = setting
        return SamplingParams(temperature=t, top_k=k, top_p=p, max_new_tokens=n, seed=seed)
