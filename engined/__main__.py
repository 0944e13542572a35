"""kimi-engine: the command line. `serve` layers its options (flag > KIMI_ENGINE_* > --config
file > default) into one EngineConfig and hands it to the daemon."""
import os
import sys

import click

from engined import __version__
from engined.config import ConfigError, EngineConfig


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="kimi-engine")
def main():
    """Serve a local model over HTTP on a Unix socket (OpenAI Chat Completions and more).

    Run `kimi-engine serve --help` for the options; see kimi-engine(8) for signals, files
    and exit status.
    """


N, SIZE, FLAG = dict(type=int, metavar="N"), dict(metavar="SIZE"), dict(is_flag=True, default=None)
DEVICES = dict(type=click.Choice(["auto", "cpu", "cuda"]))

# One row per option, in --help order: its declaration, its click settings, serve's help and
# doctor's (None: doctor has no such option). Both commands read them into one EngineConfig.
OPTIONS = [
    (["--model"], dict(metavar="default|PATH|ORG/REPO[@REV]|synthetic:NAME"),
     "The model to serve: 'default' for the embedded SmolLM2-135M-Instruct, the path of a GGUF "
     "file or a Kimi-Linear directory, a Hugging Face model id ORG/REPO[@REVISION] (from the "
     "cache `kimi-engine pull` fills; pulled first when missing, unless HF_HUB_OFFLINE is set, "
     "as the systemd unit does), or synthetic:tiny|small|kimi-linear-48b (random Kimi-Linear "
     "weights, for benchmarks).  [default: default]",
     "The model to check (as for serve)."),
    (["--socket"], dict(metavar="PATH"),
     "Unix socket to listen on (mode 0660).  [default: $RUNTIME_DIRECTORY/engine.sock, else "
     "$XDG_RUNTIME_DIR/kimi/engine.sock, else /tmp/kimi-$UID/engine.sock]",
     "The socket path to check (as for serve)."),
    (["--device"], DEVICES,
     "Where to run the model; auto picks CUDA when a GPU is present.  [default: auto]",
     "The device serve would use (cuda fails when no GPU is present)."),
    (["--memory-cap"], SIZE,
     "Refuse to start when what the model holds in RAM would exceed this, e.g. 600MB, 2GiB or "
     "a byte count: on the CPU the weights plus the KV cache for the maximum context; on CUDA "
     "the routed experts kept in RAM.  [default: no cap; a cgroup memory limit lowers it]",
     "Compare the memory plan's RAM part with this cap (as for serve)."),
    (["--max-context"], N,
     "Longest prompt + completion in tokens; the KV cache is planned for it.  [default: the "
     "model's context, at most 8192]",
     "The context the memory plan uses."),
    (["--threads"], N, "CPU threads for compute.  [default: torch's choice]", None),
    (["--max-batch"], N,
     "Most requests generating at once; their decode steps run as one batch (1..256; more wait "
     "in a queue).  [default: 8]",
     "The batch the memory plan uses."),
    (["--prefill-chunk"], dict(type=int, metavar="T"),
     "Prompt tokens per prefill step: other requests get a decode step between chunks (a "
     "multiple of 64 lines up with the prefix cache's blocks).  [default: 256 on the CPU, "
     "2048 on a GPU]", None),
    (["--prefix-cache-bytes"], SIZE,
     "Memory for reusing the KV cache (Kimi-Linear: state snapshots) of prompt prefixes seen "
     "before, e.g. 256MiB; 0 turns it off. Counted in the memory cap, least recently used "
     "evicted first.  [default: 256MiB]", None),
    (["--max-queue"], N,
     "Most requests waiting to start; one more is answered 429 with Retry-After; 0 means no "
     "bound.  [default: 16]", None),
    (["--queue-timeout-s"], dict(type=float, metavar="SECONDS"),
     "Longest a request waits to start; past it, 503 with Retry-After; 0 means no limit.  "
     "[default: 120]", None),
    (["--max-connections"], N,
     "Most connections served at once, each by a thread; at the cap, idle kept-alive ones "
     "close to make room, and a connection that still finds none within a second gets 503 "
     "with Retry-After.  [default: 64]", None),
    (["--enforce-eager"], FLAG,
     "Never capture CUDA graphs: every decode step runs eagerly (slower on a GPU; for "
     "debugging). The CPU always runs eagerly.  [default: graphs on CUDA]", None),
    (["--speculative"], dict(type=click.Choice(["on", "off"])),
     "Speculative decoding from the context: each decode step also verifies the tokens that "
     "followed the best recent match of the last few tokens in the prompt, the output or the "
     "request's prediction, with a "
     "draft length that adapts to acceptance. The tokens are those of plain decoding, greedy "
     "or seeded; a request may send \"speculative\": false.  [default: on]", None),
    (["--cpu-moe"], FLAG,
     "Keep every MoE layer's routed experts in system RAM, computed by the CPU threads; "
     "attention, the router and the shared experts stay on the GPU (llama.cpp's name). With "
     "--device cpu everything is in RAM already: accepted, and it changes nothing.  "
     "[default: planned from the GPU budget]",
     "Plan with every routed expert in RAM (as for serve)."),
    (["--n-cpu-moe"], N,
     "Keep the routed experts of the first N MoE layers in RAM (--cpu-moe wins when both are "
     "given).  [default: planned from the GPU budget]",
     "Plan with the first N MoE layers' routed experts in RAM (as for serve)."),
    (["--gpu-memory"], SIZE,
     "The GPU memory the engine may use, CUDA context included, e.g. 24GiB; with neither "
     "--cpu-moe nor --n-cpu-moe, the routed experts of as many MoE layers as fit stay on the "
     "GPU, the rest go to RAM. Ignored with --device cpu.  [default: the GPU's free memory "
     "minus 1 GiB]",
     "The GPU budget to plan for (as for serve)."),
    (["--moe-cache"], dict(metavar="SIZE|auto"),
     "GPU memory for a cache of the routed experts that the MoE layers in RAM use most "
     "recently (as llama.cpp's forks have): a chosen expert found there runs on the "
     "GPU, the rest on the CPU threads, misses are uploaded beside the decode; 0 turns it "
     "off. Ignored with --device cpu or when no experts are in RAM.  [default: auto, what "
     "the --gpu-memory budget leaves after the placement]",
     "The expert cache to plan for (as for serve)."),
    (["--moe-w4a8"], FLAG,
     "Run the routed experts the CPU computes (--device cpu, or the experts kept in RAM) in "
     "W4A8: each expert's input and SwiGLU output rounded to int8 per block of 32, then "
     "integer dots: faster prefill, and faster decode on AVX2-only CPUs (kimi-engine(8) "
     "has the figures). "
     "Its extra error is held under 2 x 7/127 of the INT4 weights' own on a test checkpoint; "
     "opt-in until measured on a real one.  [default: off, W4A16]",
     "Plan as serve --moe-w4a8 would: refused for a model without INT4 routed experts."),
    (["--log-file"], dict(metavar="PATH"),
     "Append status and request lines here instead of standard error; SIGHUP reopens it.", None),
    (["--config", "config_file"], dict(metavar="PATH"),
     "Read options from this TOML file (keys are the long option names, e.g. memory-cap = "
     "\"2GiB\"). Flags and KIMI_ENGINE_* variables override it.",
     "Read options from this TOML file, as serve does."),
]


def engine_options(command: str):
    """The table's options of `command` ("serve" or "doctor"), with that command's help."""
    column = ["serve", "doctor"].index(command)

    def decorate(fn):
        for decls, settings, *helps in reversed(OPTIONS):
            if helps[column] is not None:
                fn = click.option(*decls, help=helps[column], **settings)(fn)
        return fn
    return decorate


def layered_config(config_file, flags) -> EngineConfig:
    try:
        return EngineConfig.layered(flags, os.environ, config_file)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


@main.command()
@engine_options("serve")
def serve(config_file, **flags):
    """Load the model and serve it until SIGTERM (which drains in-flight requests)."""
    config = layered_config(config_file, flags)
    from engined.serving import daemon  # torch and the model code load only when serving

    sys.exit(daemon.run(config))


@main.command()
@engine_options("doctor")
def doctor(config_file, **flags):
    """Check what `serve` needs: versions, C helper, GPU, model, memory, cache, socket.

    Prints one line per check ("ok ..." or "x ..." with a fix); exits 0 when all pass,
    else 1.
    """
    config = layered_config(config_file, flags)
    from engined.commands import doctor as doctor_mod

    sys.exit(doctor_mod.main(config, echo=click.echo))


def _attach_model_commands():
    from engined.commands.kimi import COMMANDS  # quantize, verify, bench

    for command in COMMANDS:
        main.add_command(command)


_attach_model_commands()

if __name__ == "__main__":
    main(prog_name="kimi-engine")
