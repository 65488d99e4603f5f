"""Registration of the built-ins, through the same hooks a third-party plugin implements.

Targets are ``"module:attr"`` strings, so listing never imports the implementations.
"""

from __future__ import annotations

from agilerl import Register, hookimpl

__all__ = [
    "ENVS",
    "OBSERVATION_PROCESSORS",
    "RUBRICS",
    "ALGORITHMS",
    "MODELS",
    "TRACKERS",
    "GENERATION_BACKENDS",
    "TOOL_PARSERS",
    "register_envs",
    "register_observation_processors",
    "register_rubrics",
    "register_algorithms",
    "register_models",
    "register_trackers",
    "register_generation_backends",
    "register_tool_parsers",
]

# (name, target, description); one list per kind.
ENVS: list[tuple[str, str, str]] = [
    ("guess", "agilerl.builtins.guess:GuessEnv", "Guess a number from too high / too low hints (the docs' example)."),
    ("colors", "agilerl.builtins.colors:ColorsEnv", "Name the colour of a square shown as an image (needs a vision model)."),
]
OBSERVATION_PROCESSORS: list[tuple[str, str, str]] = [
    ("json", "agilerl.builtins.processors:json_text", "The whole observation as compact JSON."),
    (
        "code_output",
        "agilerl.builtins.processors:code_output",
        "stdout, stderr and exit code of a code-execution observation.",
    ),
]
RUBRICS: list[tuple[str, str, str]] = [
    (
        "tool_format",
        "agilerl.tools.rubric:tool_format",
        "The share of the completion's tool calls that are well-formed (status ok).",
    ),
    (
        "exact_match",
        "agilerl.builtins.rubrics:exact_match",
        "Final answer equals the row's answer (normalised case and spacing).",
    ),
    (
        "numeric_match",
        "agilerl.builtins.rubrics:numeric_match",
        "Final answer is the row's number (1,000 == 1000.0).",
    ),
    (
        "boxed_match",
        "agilerl.builtins.rubrics:boxed_match",
        "The last \\boxed{} holds the row's answer.",
    ),
    (
        "think_answer_format",
        "agilerl.builtins.rubrics:think_answer_format",
        "The completion is <think>...</think><answer>...</answer>.",
    ),
    (
        "countdown",
        "agilerl.builtins.rubrics:countdown",
        "Countdown: each number used once with + - * /, equal to the target.",
    ),
    (
        "llm_judge",
        "agilerl.builtins.rubrics:llm_judge",
        "An LLM judge on any OpenAI-compatible endpoint (config: base_url, model, prompt, ...).",
    ),
    (
        "llm_judge_group",
        "agilerl.builtins.rubrics:llm_judge_group",
        "An LLM judge ranking a whole GRPO group in one call, RULER-style (config: base_url, model, group_size).",
    ),
]
ALGORITHMS: list[tuple[str, str, str]] = [
    ("grpo", "agilerl.builtins.algorithms.grpo:GRPO", "Group-relative advantages, clipped ratio."),
    ("cispo", "agilerl.builtins.algorithms.cispo:CISPO", "GRPO with a clipped, stop-gradient IS weight."),
    ("gspo", "agilerl.builtins.algorithms.gspo:GSPO", "GRPO with a sequence-level ratio and clip."),
    ("llmppo", "agilerl.builtins.algorithms.ppo:LLMPPO", "PPO with a value head and GAE."),
    (
        "llmreinforce",
        "agilerl.builtins.algorithms.reinforce:LLMREINFORCE",
        "REINFORCE with a leave-one-out group baseline.",
    ),
    ("sft", "agilerl.builtins.algorithms.sft:SFT", "Cross-entropy on response tokens."),
    ("dpo", "agilerl.builtins.algorithms.dpo:DPO", "Direct Preference Optimization (sigmoid loss)."),
]
MODELS: list[tuple[str, str, str]] = [
    (
        "tiny",
        "agilerl.train.tiny_model:tiny_model_and_tokenizer",
        "A randomly initialised 2-layer Qwen2 with a ChatML BPE tokenizer, built offline.",
    ),
    (
        "tiny-vlm",
        "agilerl.train.tiny_model:tiny_vlm_and_tokenizer",
        "A randomly initialised tiny Qwen2-VL (vision tower + 2-layer LM) and its processor, built offline.",
    ),
]

TRACKERS: list[tuple[str, str, str]] = [
    ("tensorboard", "agilerl.builtins.trackers:tensorboard", "TensorBoard event files under <output_dir>/tensorboard."),
    ("wandb", "agilerl.builtins.trackers:wandb", "Weights & Biases (WANDB_MODE=offline works offline)."),
    ("trackio", "agilerl.builtins.trackers:trackio", "trackio's local store (TRACKIO_DIR)."),
    ("mlflow", "agilerl.builtins.trackers:mlflow", "MLflow (MLFLOW_TRACKING_URI, default ./mlruns)."),
    ("aim", "agilerl.builtins.trackers:aim", "Aim, its repository in <output_dir>."),
    ("comet_ml", "agilerl.builtins.trackers:comet_ml", "Comet."),
    ("clearml", "agilerl.builtins.trackers:clearml", "ClearML."),
    ("dvclive", "agilerl.builtins.trackers:dvclive", "DVCLive."),
    ("swanlab", "agilerl.builtins.trackers:swanlab", "SwanLab."),
]

GENERATION_BACKENDS: list[tuple[str, str, str]] = [
    (
        "transformers",
        "agilerl.generation.backends:transformers_backend",
        "Hugging Face generate on the trainer's own model (the default).",
    ),
    (
        "vllm",
        "agilerl.generation.vllm.policy:build_vllm_policy",
        "vLLM, colocated in each training process or as vllm serve replicas; weights pushed every step.",
    ),
]

TOOL_PARSERS: list[tuple[str, str, str]] = [
    ("hermes", "agilerl.tools.families:HermesParser", "<tool_call>{json}</tool_call>: Qwen2.5, Qwen3, Hermes."),
    ("qwen3_coder", "agilerl.tools.qwen3_coder:Qwen3CoderParser", "<function=NAME><parameter=P>: Qwen3-Coder's XML."),
    ("llama3_json", "agilerl.tools.families:Llama3JsonParser", '{"name": ..., "parameters": ...}: Llama 3.1-3.3.'),
    ("mistral", "agilerl.tools.families:MistralParser", "[TOOL_CALLS]: Mistral, Mixtral, Magistral."),
    ("granite", "agilerl.tools.families:GraniteParser", "<|tool_call|>[json]: IBM Granite 3."),
    ("gemma", "agilerl.tools.families:GemmaParser", "<|tool_call>call:NAME{...}<tool_call|>: Gemma 4."),
    ("harmony", "agilerl.tools.families:HarmonyParser", "GPT-OSS channels, to=functions.NAME ... <|call|>."),
    ("deepseek", "agilerl.tools.families:DeepSeekParser", "<｜tool▁call▁begin｜>: DeepSeek V3, R1, V3.1."),
]


def _register_all(register: Register, entries: list[tuple[str, str, str]]) -> None:
    for name, target, description in entries:
        register(name, target, description=description)


@hookimpl
def register_envs(register: Register) -> None:
    _register_all(register, ENVS)


@hookimpl
def register_observation_processors(register: Register) -> None:
    _register_all(register, OBSERVATION_PROCESSORS)


@hookimpl
def register_rubrics(register: Register) -> None:
    _register_all(register, RUBRICS)


@hookimpl
def register_algorithms(register: Register) -> None:
    _register_all(register, ALGORITHMS)


@hookimpl
def register_models(register: Register) -> None:
    _register_all(register, MODELS)


@hookimpl
def register_trackers(register: Register) -> None:
    _register_all(register, TRACKERS)


@hookimpl
def register_generation_backends(register: Register) -> None:
    _register_all(register, GENERATION_BACKENDS)


@hookimpl
def register_tool_parsers(register: Register) -> None:
    _register_all(register, TOOL_PARSERS)
