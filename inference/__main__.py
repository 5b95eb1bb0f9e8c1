"""Command line: `python -m inference generate --model DIR --prompt TEXT`,
`python -m inference chat --model DIR` (interactive, streaming; /reset clears, /exit or EOF quits),
`python -m inference quantize --model DIR --out DIR` (a W8A16 int8 checkpoint),
`python -m inference kernels` (build the CPU decode kernels now, or say why they cannot be),
`python -m inference plan --config CONFIG.json` (parameters, weight and KV-cache bytes, and how much
context fits one GPU, from a published config.json; exit 1 when it does not fit) and
`python -m inference serve --model DIR` (an OpenAI-compatible server over one serving engine,
`inference/server/serve.py`)."""

from __future__ import annotations

import argparse
import sys

from inference.llm import LLM
from inference.sampling_params import SamplingParams


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m inference")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="complete one prompt")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--chat", action="store_true", help="wrap the prompt as a user message")
    chat = commands.add_parser("chat", help="interactive chat")
    chat.add_argument("--system", default=None, help="system message")
    quantize = commands.add_parser("quantize", help="write a W8A16 (int8 weight-only) checkpoint")
    quantize.add_argument("--model", required=True, help="checkpoint directory")
    quantize.add_argument("--out", required=True, help="directory for the int8 checkpoint")
    commands.add_parser("kernels", help="build the CPU decode kernels (or say why not); exit 1 without them")
    plan = commands.add_parser("plan", help="size a model from its config.json for one GPU; exit 1 when it does not fit")
    plan.add_argument("--config", required=True, help="a published Hugging Face config.json")
    plan.add_argument("--gpu-mem-gib", type=float, default=141.0, help="GPU memory in GiB (default 141, an H200)")
    plan.add_argument("--dtype", choices=("bf16", "int8", "fp8"), default="bf16", help="weight format (default bf16)")
    plan.add_argument("--context", type=int, default=None, help="tokens per sequence (default: max_position_embeddings)")
    plan.add_argument("--reserve-gib", type=float, default=4.0, help="kept for activations/workspace (default 4)")
    from inference.server import serve

    serve.add_arguments(commands.add_parser("serve", help="an OpenAI-compatible HTTP server over the serving engine"))
    for command in (generate, chat):
        command.add_argument("--model", required=True, help="checkpoint directory")
        command.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: the checkpoint's; fp32 serves in bf16 on CUDA)")
        command.add_argument("--device", default=None, help="default: cuda when present, else cpu")
        command.add_argument("--sliding-window", type=int, default=None)
        command.add_argument("--global-interval", type=int, default=None)
        command.add_argument("--max-tokens", type=int, default=256)
        command.add_argument("--temperature", type=float, default=0.7)
        command.add_argument("--top-p", type=float, default=0.9)
        command.add_argument("--top-k", type=int, default=0)
        command.add_argument("--repetition-penalty", type=float, default=1.0)
        command.add_argument("--seed", type=int, default=None)
        command.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
        command.add_argument("--ignore-eos", action="store_true", help="generate all --max-tokens tokens")
        command.add_argument("--quantization", default=None, help="w8a16: int8 weights at load time")
        command.add_argument("--speculative-k", type=int, default=None, help="MTP draft length 1..8")
    return parser


def _params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        max_tokens=args.max_tokens,
        stop=args.stop,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )


def _print_stream(llm: LLM, prompt, params: SamplingParams) -> str:
    text = ""
    for output in llm.stream(prompt, params):
        print(output.delta, end="", flush=True)
        text = output.text
    print()
    return text


def _chat(llm: LLM, args: argparse.Namespace) -> None:
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    while True:
        try:
            line = input("> ")
        except EOFError:
            return
        if line.strip() == "/exit":
            return
        if line.strip() == "/reset":
            messages = list(system)
            continue
        messages.append({"role": "user", "content": line})
        reply = _print_stream(llm, messages, _params(args))
        messages.append({"role": "assistant", "content": reply})


def main(argv: list[str] | None = None) -> int:
    args = _arguments().parse_args(argv)
    if args.command == "kernels":
        from inference.layers.kernels import cpu_kernels

        print(cpu_kernels.describe())
        return 0 if cpu_kernels.available() else 1
    if args.command == "plan":
        from inference.plan import run

        code, report = run(args.config, args.dtype, args.gpu_mem_gib, args.context, args.reserve_gib)
        print(report, file=sys.stderr if code == 2 else sys.stdout)
        return code
    if args.command == "serve":
        from inference.server.serve import serve

        return serve(args)
    if args.command == "quantize":
        from inference.quantize import quantize_checkpoint

        quantize_checkpoint(args.model, args.out)
        print(f"wrote {args.out}")
        return 0
    llm = LLM.from_pretrained(
        args.model,
        dtype=args.dtype,
        device=args.device,
        sliding_window=args.sliding_window,
        global_interval=args.global_interval,
        quantization=args.quantization,
        speculative_k=args.speculative_k or 0,
    )
    if llm.tokenizer is None:
        print(f"{args.model} has no tokenizer.json", file=sys.stderr)
        return 2
    if args.command == "chat":
        _chat(llm, args)
    else:
        prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
        _print_stream(llm, prompt, _params(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
