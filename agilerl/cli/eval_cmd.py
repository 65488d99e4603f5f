"""``agilerl eval``: score a model on an env without training (mean reward, accuracy, pass@k),
with every episode's transcript in a JSONL file that ``--resume`` continues."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from agilerl.cli.args import json_object, new_tokens, positive_float, positive_int
from agilerl.cli.json_output import print_json
from agilerl.errors import InvalidArgument, redact

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "DEFAULT_BACKEND", "add_parser"]

DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_BACKEND = "transformers"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="Evaluate a model on an env: reward, accuracy, pass@k, transcripts.",
        description="SOURCE is a manifest (its environment:, and model: unless --model is given) "
        "or an env entrypoint (registered name, module:attr, file.py:attr); or pass --env-url. "
        "The model is local (a registered name such as 'tiny', a folder, a .gguf file or a hub id, "
        "generated with --backend) or, with --base-url, any OpenAI-compatible chat endpoint "
        "(vllm serve, llama.cpp's server, hosted APIs). Each episode is one JSON line in --output.",
    )
    parser.add_argument("source", nargs="?", help="Manifest file or env entrypoint.")
    env = parser.add_argument_group("env")
    env.add_argument("--env-url", action="append", help="A remote env server (repeat for replicas).")
    env.add_argument("--env-config", type=json_object, default={}, help="JSON keyword arguments for the env.")
    env.add_argument("--max-turns", type=positive_int, help="Turn budget (default: the env's).")
    env.add_argument(
        "--tool-parser",
        help="Run the model's tool calls as the env's call_tool: a parser (hermes, ..., auto; "
        "agilerl tool-parsers list). With --base-url the endpoint's structured tool_calls are used.",
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model", help="Local model, or the endpoint's model name with --base-url.")
    model.add_argument(
        "--backend", default=None,
        help=f"Generation backend for a local model: a registered name (agilerl backends list; default: "
        f"the manifest's generation.backend, else {DEFAULT_BACKEND}).",
    )
    model.add_argument("--base-url", help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1.")
    model.add_argument("--api-key", help="The endpoint's key (default: $OPENAI_API_KEY).")
    model.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="Local model's dtype.")
    model.add_argument("--max-model-len", type=positive_int, help="Local model's context length.")
    plan = parser.add_argument_group("episodes")
    plan.add_argument(
        "-n", "--num-tasks", type=positive_int,
        help="Tasks to play (default: the env's whole held-out split, else 8).",
    )
    plan.add_argument("-k", "--samples", type=positive_int, default=1, help="Episodes per task: the k of pass@k (default: 1).")
    plan.add_argument("--concurrency", type=positive_int, default=16, help="Episodes at once (default: 16).")
    plan.add_argument("--seed", type=int, default=0, help="Task i plays seed+i; seeds sampling (default: 0).")
    plan.add_argument("--temperature", type=float, help="Default: 0 (greedy) with -k 1, else 1.0.")
    plan.add_argument("--top-p", type=float, default=1.0, help="Nucleus sampling (default: 1, off).")
    plan.add_argument("--top-k", type=int, default=0, help="Top-k sampling (default: 0, off).")
    plan.add_argument("--max-new-tokens", type=new_tokens, help="Tokens per turn (default: the manifest's, else 256).")
    plan.add_argument("--max-reward", type=positive_float, help="Accuracy is reward / max_reward (default: the env's).")
    plan.add_argument("--pass-threshold", type=float, help="An episode passes at this reward (default: max_reward).")
    out = parser.add_argument_group("output")
    out.add_argument("--output", "-o", help="Results JSONL (default: evals/<env>--<model>.jsonl).")
    out.add_argument("--resume", action="store_true", help="Continue a partly written --output.")
    out.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    out.add_argument("--no-progress", action="store_true", help="No progress bar.")
    parser.set_defaults(handler=_eval)


def _eval(args: argparse.Namespace) -> int:
    from agilerl.assembly.evaluation import EvalPlan, evaluate_spec
    from agilerl.manifest.environment import EnvUrlSpec
    from agilerl.generation.policy import SamplingParams

    spec, manifest, env_label = _env_spec(args)
    model_name = args.model or (manifest.model.name_or_path if manifest else None)
    if model_name is None:
        raise InvalidArgument("--model is required: name a local model ('tiny', a folder, a hub id), or the served model with --base-url")
    if args.base_url and args.backend:
        raise InvalidArgument("--backend applies to a local model; with --base-url the endpoint generates: drop one")
    backend = "openai" if args.base_url else args.backend or (manifest.generation.backend if manifest else DEFAULT_BACKEND)
    training = manifest.training if manifest else None
    temperature = args.temperature if args.temperature is not None else (0.0 if args.samples == 1 else 1.0)
    if args.samples > 1 and temperature == 0:
        print("warning: -k > 1 with temperature 0: every sample of a task is the same greedy episode", file=sys.stderr)
    sampling = SamplingParams(
        temperature=temperature, top_p=args.top_p, top_k=args.top_k,
        max_new_tokens=args.max_new_tokens or (training.max_new_tokens if training else DEFAULT_MAX_NEW_TOKENS),
    )
    env_config = {} if isinstance(spec, EnvUrlSpec) else spec.env_config  # a remote env has none here
    label = {"model": model_name, "backend": backend, "env": env_label, "env_config": env_config}
    output = Path(args.output or Path("evals") / f"{_slug(env_label)}--{_slug(model_name)}.jsonl")
    plan = EvalPlan(
        output=output, num_tasks=args.num_tasks,
        samples=args.samples, concurrency=args.concurrency, seed=args.seed, sampling=sampling,
        max_reward=args.max_reward, pass_threshold=args.pass_threshold, resume=args.resume, label=label,
    )
    policy, tokenizer = _policy(args, manifest, model_name, backend, spec)
    try:
        summary = evaluate_spec(
            spec, policy, tokenizer, plan, base_dir=manifest.base_dir if manifest else None,
            show_progress=not args.no_progress and not args.json,
        )
    except KeyboardInterrupt:
        print(f"interrupted; the finished episodes are in {output}: continue with --resume", file=sys.stderr)
        raise
    finally:
        close = getattr(policy, "close", None)
        if callable(close):
            close()
    if args.json:
        print_json(summary.as_dict())
        return 0
    _print_summary(summary)
    return 0


def _env_spec(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """The env spec, the manifest (when SOURCE is one) and a label naming the env."""
    from agilerl.manifest.spec import parse_env_spec

    if args.env_url and args.source:
        raise InvalidArgument(f"give SOURCE ({args.source!r}) or --env-url, not both")
    if not args.env_url and not args.source:
        raise InvalidArgument("name the env: SOURCE (a manifest or an entrypoint such as 'guess') or --env-url URL")
    manifest = None
    if args.source and Path(args.source).suffix in (".yaml", ".yml"):
        from agilerl.cli.manifest_cmd import load_manifest_reporting_warnings

        if args.env_config:
            raise InvalidArgument("--env-config applies to an entrypoint; with a manifest, edit environment.env_config")
        manifest = load_manifest_reporting_warnings(args.source)
        spec = manifest.environment
        if args.max_turns is not None:
            spec = spec.model_copy(update={"max_turns": args.max_turns})
        if args.tool_parser is not None:
            spec = parse_env_spec({**spec.model_dump(by_alias=False, exclude_none=True), "tool_parser": args.tool_parser})
        return spec, manifest, args.source
    fields: dict[str, Any] = {"env_type": "rollout"}
    if args.env_config:
        fields["env_config"] = args.env_config
    if args.env_url:
        fields["env_url"] = args.env_url if len(args.env_url) > 1 else args.env_url[0]
    else:
        fields["entrypoint"] = args.source
    if args.max_turns is not None:
        fields["max_turns"] = args.max_turns
    if args.tool_parser is not None:
        fields["tool_parser"] = args.tool_parser
    return parse_env_spec(fields), None, redact(",".join(args.env_url or [args.source]))


def _policy(args: argparse.Namespace, manifest: Any, model_name: str, backend: str, spec: Any) -> tuple[Any, Any]:
    """The policy and the tokenizer the harness renders with."""
    if args.base_url:
        from agilerl.generation.openai_policy import OpenAIChatPolicy
        from agilerl.peers import clean_secret, secret_from_env

        extra = {"chat_template_kwargs": spec.chat_template_kwargs} if spec.chat_template_kwargs else None
        key = clean_secret(args.api_key, "--api-key") if args.api_key else secret_from_env("OPENAI_API_KEY")
        policy = OpenAIChatPolicy(
            args.base_url, model_name, api_key=key,
            max_concurrency=args.concurrency, extra_body=extra,
        )
        return policy, policy.tokenizer
    from agilerl.manifest.settings import ModelSettings

    base = manifest.model.model_dump(exclude_unset=True) if manifest else {}
    fields = {**base, "name_or_path": model_name}
    if args.dtype:
        fields["dtype"] = args.dtype
    if args.max_model_len:
        fields["max_model_len"] = args.max_model_len
    settings = ModelSettings.model_validate(fields)
    from agilerl.registry import get_registry

    get_registry().get("backend", backend)  # an unknown name fails before the model loads
    # the manifest's generation: options belong to its backend only
    options = manifest.generation.options if manifest and manifest.generation.backend == backend else {}
    import torch

    from agilerl.assembly.models import load_model_and_tokenizer
    from agilerl.generation.backends import build_generation

    torch.manual_seed(args.seed)
    model, tokenizer = load_model_and_tokenizer(settings, base_dir=manifest.base_dir if manifest else None, seed=args.seed)
    policy = build_generation(
        backend, model, tokenizer, max_model_len=settings.max_model_len, seed=args.seed, options=options
    )
    return policy, tokenizer


def _slug(text: str) -> str:
    """A file-name-safe form of an env or model name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(text).stem if text.endswith((".yaml", ".yml")) else text).strip("_") or "x"


def _print_summary(summary: Any) -> None:
    def number(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.4f}"

    print(
        f"episodes: {summary.episodes} ({summary.failures} failed) over {summary.tasks} tasks x "
        f"{summary.samples} samples; {summary.played} played now, {summary.resumed} resumed"
    )
    print(f"reward:   mean {number(summary.reward_mean)}  std {number(summary.reward_std)}  turns {number(summary.turns_mean)}")
    print(f"accuracy: {number(summary.accuracy)}" + ("" if summary.accuracy is not None else "  (set --max-reward or environment.max_reward)"))
    if summary.pass_at_k:
        print("pass@k:   " + "  ".join(f"pass@{k} {v:.4f}" for k, v in summary.pass_at_k.items()))
    else:
        print("pass@k:   n/a (an episode passes at --pass-threshold, default max_reward; neither is set)")
    if summary.reward_components:
        print("components: " + "  ".join(f"{k} {v:.4f}" for k, v in summary.reward_components.items()))
    if summary.tools:
        print("tool calls: " + "  ".join(f"{k.removeprefix('tools/')} {v:.4f}" for k, v in summary.tools.items()))
    if summary.judge:
        print("judge:    " + "  ".join(f"{k.removeprefix('judge/')} {v:g}" for k, v in summary.judge.items()))
    print(f"results:  {summary.output}")

