"""Kimi-Linear commands for the `kimi-engine` click group: quantize, verify, bench.

Attach in engined/__main__.py:  from engined.commands.kimi import COMMANDS; [main.add_command(c) for c in COMMANDS]
Errors are CheckpointError subclasses inside; they are rendered once here as a one-line message.
"""
import json
import os

import click

from engined.weights.shards import CheckpointError


def _run(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (CheckpointError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.argument("src", metavar="SRC")
@click.argument("dst", type=click.Path())
@click.option("--plan", type=click.Choice(["selective", "all", "none"]), default="selective", show_default=True,
              help="selective: experts, attention q/k/v/o, MLA q/kv_b/o, dense MLP to INT4; all: also "
                   "low-rank KDA projections, kv_a and lm_head; none: verified BF16 copy")
@click.option("--group-size", type=int, default=32, show_default=True, help="INT4 group along the input axis")
@click.option("--quiet", is_flag=True, help="no progress bar")
def quantize(src, dst, plan, group_size, quiet):
    """Write a packed-INT4 Kimi-Linear artifact from the BF16 checkpoint SRC into DST.

    SRC is a checkpoint directory or a model id ORG/REPO[@REVISION], downloaded whole into the
    Hugging Face cache first (`kimi-engine pull` instead quantizes into the engine's cache
    shard by shard, without keeping the BF16)."""
    from engined.weights.hub import ids, remote
    from engined.weights.quantize import quantize_checkpoint
    hub_id = ids.parse(src)
    if hub_id is not None:
        src = _run(remote.snapshot, hub_id)
    elif not os.path.isdir(os.path.expanduser(src)):
        raise click.BadParameter(f"{src!r} is neither a directory nor a model id ORG/REPO",
                                 param_hint="SRC")
    manifest = _run(quantize_checkpoint, src, dst, plan=plan, group_size=group_size, progress=not quiet)
    quantized = sum(n.endswith(".qweight") for n in manifest["tensors"])
    size = sum(f["size"] for f in manifest["files"].values())
    click.echo(f"wrote {dst}: plan {plan}, {quantized} INT4 matrices, {size / 2**30:.2f} GiB, "
               f"manifest kimi-int4.json")


@click.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def verify(path):
    """Re-hash every file of the artifact at PATH and check it against kimi-int4.json."""
    from engined.weights.manifest import verify_artifact
    summary = _run(verify_artifact, path)
    click.echo(f"OK {path}: " + json.dumps(summary, sort_keys=True))


@click.command()
@click.option("--synthetic", "config", default="kimi-linear-48b", show_default=True,
              type=click.Choice(["kimi-linear-48b", "small", "tiny"]), help="model shape, random weights")
@click.option("--config", "config", type=click.Choice(["kimi-linear-48b", "small", "tiny"]),
              help="alias of --synthetic (tiny|small for CPU)")
@click.option("--int4", is_flag=True, help="selective INT4 weights (the quantizer's plan)")
@click.option("--device", default=None, help="cuda or cpu (default: cuda when available)")
@click.option("--repeats", type=int, default=5, show_default=True)
@click.option("--record", type=click.Path(dir_okay=False), help="append the result line to this file")
def bench(config, int4, device, repeats, record):
    """Batch-1 greedy decode tok/s on synthetic weights, against the bandwidth roofline."""
    from engined.commands import bench as synthetic_bench
    argv = ["--synthetic", config, "--repeats", str(repeats)] + (["--int4"] if int4 else [])
    argv += (["--device", device] if device else []) + (["--record", record] if record else [])
    synthetic_bench.main(argv)


from engined.commands.hub import models, pull  # noqa: E402

COMMANDS = (quantize, verify, bench, pull, models)
