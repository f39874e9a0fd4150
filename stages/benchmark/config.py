"""Settings of the benchmark stage (the recipe's ``benchmark`` section); the recipe imports this module only."""

from __future__ import annotations

from typing import Annotated, Literal, TypedDict

from pydantic import Field, model_validator

from qdeploy.core.stage_config import StageConfig
from qdeploy.core.tolerance import StrictModel

__all__ = ["DEFAULT_BUSY_SECONDS", "DEFAULT_DECODE", "DEFAULT_ITERATIONS", "DEFAULT_MAX_SECONDS",
           "DEFAULT_TIMED_SECONDS", "DEFAULT_WARMUP", "DEFAULT_WARMUP_SECONDS", "MAX_EXTRA_ROUND_FACTOR", "MODE",
           "NOISY_SPREAD", "BenchmarkConfig", "DecodeConfig", "MeasureRecord", "Mode", "ThroughputConfig"]


Mode = Literal["latency", "throughput", "both"]


class MeasureRecord(TypedDict):
    """How warm-up and measurement were bounded (a row's ``measure``, ``BenchmarkConfig.measure_record``)."""

    warmup: str
    warmup_runs: int | None
    warmup_seconds: float | None
    by: str
    iterations: int | None
    duration_seconds: float | None
    rounds: int
    max_seconds: float
    timed_seconds_cap: float | None
    warmup_seconds_cap: float | None
    busy_seconds: float


class ThroughputConfig(StrictModel):
    """The recipe's `benchmark.throughput` section (used when `benchmark.mode` is throughput or both)."""

    requests: int | Literal["auto"] = Field(
        default="auto", description="Requests kept in flight; auto: OpenVINO's OPTIMAL_NUMBER_OF_INFER_REQUESTS "
                                    "under PERFORMANCE_HINT THROUGHPUT, the physical cores on ONNX Runtime (one "
                                    "intra-op thread each).")
    seconds: float = Field(default=10.0, gt=0, le=3600,
                           description="Timed seconds per artifact, split evenly over benchmark.rounds.")
    warmup_seconds: float = Field(default=1.0, ge=0, le=600,
                                  description="Untimed seconds with every request busy, before the rounds.")

    @property
    def fixed_requests(self) -> int | None:
        return None if self.requests == "auto" else int(self.requests)


class DecodeConfig(StrictModel):
    """The recipe's `benchmark.decode` section: generation speed of a language model with a KV cache."""

    prompt: int = Field(default=128, ge=1, le=131072,
                        description="Prompt tokens of the prefill call (one call, empty cache).")
    tokens: int = Field(default=16, ge=1, le=100_000,
                        description="Single-token decode steps after the prefill, each fed the previous step's "
                                    "presents as its past (a growing cache).")


DEFAULT_DECODE = DecodeConfig()
"""What a model with a KV cache gets when the recipe has no benchmark.decode: prompt 128, tokens 16."""

NOISY_SPREAD = 0.10
"""A median whose 95% confidence interval is wider than this share of it cannot rank close variants."""
DEFAULT_WARMUP = 10
DEFAULT_ITERATIONS = 50
DEFAULT_MAX_SECONDS = 60.0
"""Time budget of one row (warm-up and timed runs of one artifact at one batch size), as benchmark_app's -t."""
DEFAULT_TIMED_SECONDS = 10.0
"""With neither iterations nor duration_seconds set, the default runs stop at this many timed seconds per artifact:
a fast model gets its 50 runs, a slow one (hundreds of MB) as many as fit, at least one per round."""
DEFAULT_WARMUP_SECONDS = 2.0
"""With neither warmup nor warmup_seconds set, the default warm-up runs stop at this many seconds."""
DEFAULT_BUSY_SECONDS = 60.0
"""Extra seconds per target and batch size a busy machine may add in rounds before the benchmark decides."""
MAX_EXTRA_ROUND_FACTOR = 4
"""A busy machine adds at most this many times the planned rounds."""
MODE = "sync, one request at a time"


class BenchmarkConfig(StageConfig):
    """The recipe's `benchmark` section."""

    enabled: bool = Field(default=True, description="Run benchmarks at all.")
    mode: Mode = Field(  # type: ignore[valid-type]
        default="latency",
        description="latency: one request at a time (what speedup gates compare); throughput: inferences per "
                    "second with many requests in flight (OpenVINO THROUGHPUT hint + AsyncInferQueue, ONNX Runtime "
                    "concurrent callers), and the latency at that load; both: each.")
    throughput: ThroughputConfig | None = Field(
        default=None, description="Settings of the throughput mode (requests, seconds, warm-up).")
    batch_sizes: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default=[1], min_length=1, max_length=32,
        description="Batch sizes to measure; every artifact is validated at each too.")
    data: str | None = Field(
        default=None,
        description="Dataset fed (stacked to each batch size); when absent validate.data, else the recipe's first "
                    "dataset of real samples, else seeded random data.")
    max_seconds: float | None = Field(
        default=None, gt=0, le=86400,
        description=f"Time budget of a row (warm-up and timed runs): runs stop when it is spent and the row says so; "
                    f"{DEFAULT_MAX_SECONDS:g} s when absent (more when warmup/duration_seconds ask for more).")
    warmup: int | None = Field(
        default=None, ge=0, le=100_000,
        description=f"Untimed runs of each artifact after the first run and before measuring; {DEFAULT_WARMUP} "
                    "when neither this nor warmup_seconds is set.")
    warmup_seconds: float | None = Field(
        default=None, ge=0, le=600,
        description="Warm up by time instead: untimed runs of each artifact for this many seconds.")
    iterations: int | None = Field(
        default=None, ge=1, le=10_000_000,
        description=f"Timed runs of each artifact; {DEFAULT_ITERATIONS} when neither this nor duration_seconds is set.")
    duration_seconds: float | None = Field(
        default=None, gt=0, le=3600,
        description="Measure by time budget instead: timed runs of each artifact for this many seconds in all, "
                    "split evenly over the rounds (at least one run per round).")
    rounds: int = Field(default=5, ge=1, le=1000,
                        description="Rounds the timed runs are split into, artifacts interleaved.")
    busy_seconds: float = Field(
        default=DEFAULT_BUSY_SECONDS, ge=0, le=3600,
        description="Extra seconds per target and batch size spent on more rounds when the machine is busy (other "
                    "processes use the cores, or the rounds spread widely) and the rounds cannot yet tell the "
                    f"fastest artifact from another; at most {MAX_EXTRA_ROUND_FACTOR}x the planned rounds; 0 "
                    "takes none.  Rows say how many extra rounds ran and how busy the machine was.")
    device_default: bool = Field(
        default=True,
        description="On targets whose device runs float32 models below float32 by default (OpenVINO on CPUs with "
                    "AVX512-BF16 or AMX: bfloat16), also validate and time the reference at that default, as the "
                    "row fp32@default: what deploying without quantizing gives. Speedups are then given against it "
                    "too, and the verdict may ship it.")
    weight_only_f32: bool = Field(
        default=True,
        description="On the same targets, also validate and time each weight-only artifact pinned to f32 (its "
                    "activations in float32), as the row <variant>@f32; the verdict ships the faster that passed.")
    decode: DecodeConfig | bool | None = Field(
        default=None,
        description="Decode benchmark of language models with a KV cache (past inputs paired with present outputs): "
                    "{prompt: tokens of the prefill (default 128), tokens: single-token decode steps (default 16)}; "
                    "reports prefill ms, decode ms per token and tokens/s. Absent or true: on with the defaults for "
                    "models that have a cache; false: off. Other models keep the plain benchmark.")
    threads: int | None = Field(
        default=None, ge=1, le=1024,
        description="Intra-op threads (ONNX Runtime intra_op_num_threads, OpenVINO INFERENCE_NUM_THREADS); "
                    "the runtime's default when absent.")

    @model_validator(mode="after")
    def _count_or_time(self) -> BenchmarkConfig:
        if self.throughput is not None and self.mode == "latency":
            raise ValueError("benchmark.throughput is set but benchmark.mode is latency: set mode to throughput "
                             "or both, or remove the throughput section")
        if self.warmup is not None and self.warmup_seconds is not None:
            raise ValueError("give warmup (runs) or warmup_seconds (time), not both")
        if self.iterations is not None and self.duration_seconds is not None:
            raise ValueError("give iterations (runs) or duration_seconds (time budget), not both")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError(f"batch_sizes repeat: {self.batch_sizes}")
        timed = (self.duration_seconds or 0) + (self.warmup_seconds or 0)
        if self.max_seconds is not None and timed > self.max_seconds:
            raise ValueError(f"warmup_seconds + duration_seconds ({timed:g} s) exceed max_seconds "
                             f"({self.max_seconds:g} s), the time budget of a row: raise max_seconds")
        return self

    @property
    def decode_settings(self) -> DecodeConfig | None:
        """The decode plan for models with a KV cache; None when the recipe turned it off."""
        if self.decode is False:
            return None
        return self.decode if isinstance(self.decode, DecodeConfig) else DEFAULT_DECODE

    @property
    def throughput_settings(self) -> ThroughputConfig:
        return self.throughput or ThroughputConfig()

    @property
    def row_budget(self) -> float:
        """Seconds one row may spend in warm-up and timed runs."""
        if self.max_seconds is not None:
            return self.max_seconds
        timed = (self.duration_seconds or 0) + (self.warmup_seconds or 0)
        return max(DEFAULT_MAX_SECONDS, timed + 10.0)

    @property
    def warmup_seconds_cap(self) -> float:
        """Seconds the warm-up may take: warmup_seconds, else the default cap unless a run count was asked for."""
        if self.warmup_seconds is not None:
            return self.warmup_seconds
        return DEFAULT_WARMUP_SECONDS if self.warmup is None else float("inf")

    @property
    def round_seconds_cap(self) -> float | None:
        """Seconds one round of the default run count may take (the default is bounded by time); None when the
        recipe set iterations or duration_seconds."""
        if self.iterations is not None or self.duration_seconds is not None:
            return None
        return DEFAULT_TIMED_SECONDS / len(self.round_plan())

    @property
    def warmup_runs(self) -> int:
        """Warm-up runs when warming up by count (0 when warming up by time)."""
        if self.warmup_seconds is not None:
            return 0
        return DEFAULT_WARMUP if self.warmup is None else self.warmup

    @property
    def timed_runs(self) -> int | None:
        """Timed runs of each artifact, or None when measuring by time budget."""
        if self.duration_seconds is not None:
            return None
        return DEFAULT_ITERATIONS if self.iterations is None else self.iterations

    def round_plan(self) -> list[int | float]:
        """Per round: a run count (int) or a time budget in seconds (float)."""
        runs = self.timed_runs
        if runs is None:
            assert self.duration_seconds is not None
            return [self.duration_seconds / self.rounds] * self.rounds
        rounds = min(self.rounds, runs)
        return [runs // rounds + (1 if index < runs % rounds else 0) for index in range(rounds)]

    def measure_record(self) -> MeasureRecord:
        """How warm-up and measurement were bounded, for the result."""
        return {"warmup": "time" if self.warmup_seconds is not None else "runs",
                "warmup_runs": None if self.warmup_seconds is not None else self.warmup_runs,
                "warmup_seconds": self.warmup_seconds,
                "by": "time" if self.duration_seconds is not None else "runs",
                "iterations": self.timed_runs, "duration_seconds": self.duration_seconds,
                "rounds": len(self.round_plan()), "max_seconds": self.row_budget,
                "timed_seconds_cap": None if self.round_seconds_cap is None else DEFAULT_TIMED_SECONDS,
                "warmup_seconds_cap": None if self.warmup is not None or self.warmup_seconds is not None
                else DEFAULT_WARMUP_SECONDS,
                "busy_seconds": self.busy_seconds}


