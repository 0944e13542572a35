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


@main.command()
@click.option("--model", metavar="default|PATH|synthetic:NAME",
              help="The model to serve: 'default' for the embedded SmolLM2-135M-Instruct, the "
                   "path of a GGUF file or a Kimi-Linear directory, or synthetic:tiny|small|"
                   "kimi-linear-48b (random Kimi-Linear weights, for benchmarks).  "
                   "[default: default]")
@click.option("--socket", metavar="PATH",
              help="Unix socket to listen on (mode 0660).  [default: "
                   "$RUNTIME_DIRECTORY/engine.sock, else $XDG_RUNTIME_DIR/kimi/engine.sock, "
                   "else /tmp/kimi-$UID/engine.sock]")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]),
              help="Where to run the model; auto picks CUDA when a GPU is present.  "
                   "[default: auto]")
@click.option("--memory-cap", metavar="SIZE",
              help="Refuse to start when what the model holds in RAM would exceed this, "
                   "e.g. 600MB, 2GiB or a byte count: on the CPU the weights plus the KV "
                   "cache for the maximum context; on CUDA the routed experts kept in RAM.  "
                   "[default: no cap; a cgroup memory limit lowers it]")
@click.option("--max-context", type=int, metavar="N",
              help="Longest prompt + completion in tokens; the KV cache is planned for it.  "
                   "[default: the model's context, at most 8192]")
@click.option("--threads", type=int, metavar="N",
              help="CPU threads for compute.  [default: torch's choice]")
@click.option("--max-batch", type=int, metavar="N",
              help="Most requests generating at once; their decode steps run as one batch "
                   "(1..256; more wait in a queue).  [default: 8]")
@click.option("--prefill-chunk", type=int, metavar="T",
              help="Prompt tokens per prefill step: other requests get a decode step "
                   "between chunks (a multiple of 64 lines up with the prefix cache's "
                   "blocks).  [default: 256]")
@click.option("--prefix-cache-bytes", metavar="SIZE",
              help="Memory for reusing the KV cache (Kimi-Linear: state snapshots) of "
                   "prompt prefixes seen before, e.g. 256MiB; 0 turns it off. Counted in "
                   "the memory cap, least recently used evicted first.  [default: 256MiB]")
@click.option("--max-queue", type=int, metavar="N",
              help="Most requests waiting to start; one more is answered 429 with "
                   "Retry-After; 0 means no bound.  [default: 16]")
@click.option("--queue-timeout-s", type=float, metavar="SECONDS",
              help="Longest a request waits to start; past it, 503 with Retry-After; "
                   "0 means no limit.  [default: 120]")
@click.option("--max-connections", type=int, metavar="N",
              help="Most connections served at once, each by a thread; at the cap, idle "
                   "kept-alive ones close to make room, and a connection that still finds "
                   "none within a second gets 503 with Retry-After.  [default: 64]")
@click.option("--enforce-eager", is_flag=True, default=None,
              help="Never capture CUDA graphs: every decode step runs eagerly (slower on a "
                   "GPU; for debugging). The CPU always runs eagerly.  [default: graphs on CUDA]")
@click.option("--cpu-moe", is_flag=True, default=None,
              help="Keep every MoE layer's routed experts in system RAM, computed by the CPU "
                   "threads; attention, the router and the shared experts stay on the GPU "
                   "(llama.cpp's name). With --device cpu everything is in RAM already: "
                   "accepted, and it changes nothing.  [default: planned from the GPU budget]")
@click.option("--n-cpu-moe", type=int, metavar="N",
              help="Keep the routed experts of the first N MoE layers in RAM (--cpu-moe "
                   "wins when both are given).  [default: planned from the GPU budget]")
@click.option("--gpu-memory", metavar="SIZE",
              help="The GPU memory the engine may use, CUDA context included, e.g. 24GiB; "
                   "with neither --cpu-moe nor --n-cpu-moe, the routed experts of as many MoE layers as "
                   "fit stay on the GPU, the rest go to RAM. Ignored with --device cpu.  "
                   "[default: the GPU's free memory minus 1 GiB]")
@click.option("--log-file", metavar="PATH",
              help="Append status and request lines here instead of standard error; "
                   "SIGHUP reopens it.")
@click.option("--config", "config_file", metavar="PATH",
              help="Read options from this TOML file (keys are the long option names, e.g. "
                   "memory-cap = \"2GiB\"). Flags and KIMI_ENGINE_* variables override it.")
def serve(config_file, **flags):
    """Load the model and serve it until SIGTERM (which drains in-flight requests)."""
    try:
        config = EngineConfig.layered(flags, os.environ, config_file)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    from engined.serving import daemon  # torch and the model code load only when serving

    sys.exit(daemon.run(config))


@main.command()
@click.option("--model", metavar="default|PATH|synthetic:NAME",
              help="The model to check (as for serve).")
@click.option("--socket", metavar="PATH", help="The socket path to check (as for serve).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]),
              help="The device serve would use (cuda fails when no GPU is present).")
@click.option("--memory-cap", metavar="SIZE",
              help="Compare the memory plan's RAM part with this cap (as for serve).")
@click.option("--max-context", type=int, metavar="N", help="The context the memory plan uses.")
@click.option("--max-batch", type=int, metavar="N", help="The batch the memory plan uses.")
@click.option("--cpu-moe", is_flag=True, default=None,
              help="Plan with every routed expert in RAM (as for serve).")
@click.option("--n-cpu-moe", type=int, metavar="N",
              help="Plan with the first N MoE layers' routed experts in RAM (as for serve).")
@click.option("--gpu-memory", metavar="SIZE", help="The GPU budget to plan for (as for serve).")
@click.option("--config", "config_file", metavar="PATH",
              help="Read options from this TOML file, as serve does.")
def doctor(config_file, **flags):
    """Check what `serve` needs: versions, C helper, GPU, model, memory, cache, socket.

    Prints one line per check ("ok ..." or "x ..." with a fix); exits 0 when all pass,
    else 1.
    """
    try:
        config = EngineConfig.layered(flags, os.environ, config_file)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    from engined.commands import doctor as doctor_mod

    sys.exit(doctor_mod.main(config, echo=click.echo))


def _attach_model_commands():
    from engined.commands.kimi import COMMANDS  # quantize, verify, bench

    for command in COMMANDS:
        main.add_command(command)


_attach_model_commands()

if __name__ == "__main__":
    main(prog_name="kimi-engine")
