"""`kimi-engine pull` and `kimi-engine models [rm]`: the engine's cache of models by id.

Errors (PullError, NotPulled, ...) are CheckpointError subclasses, rendered once as a line."""
import click

from engined.config import format_size
from engined.weights.shards import CheckpointError


def _hub_id(spec: str):
    from engined.weights.hub import ids

    hub_id = ids.parse(spec)
    if hub_id is None:
        raise click.UsageError(f"{spec!r} is not a model id ORG/REPO[@REVISION] (or it is an "
                               "existing local path)")
    return hub_id


@click.command()
@click.argument("model", metavar="ORG/REPO[@REVISION]")
@click.option("--keep-source", is_flag=True,
              help="Keep the BF16 files (in the cache, beside the artifact). Without it each "
                   "BF16 shard is deleted once quantized and verified, so the peak disk is the "
                   "artifact plus one shard.")
@click.option("--plan", type=click.Choice(["selective", "all", "none"]), default="selective",
              show_default=True, help="The INT4 plan, as for `kimi-engine quantize`.")
@click.option("--group-size", type=int, default=32, show_default=True,
              help="INT4 group along the input axis.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def pull(model, keep_source, plan, group_size, quiet):
    """Download a Kimi-Linear repository from the Hugging Face hub and quantize it into the
    engine's cache, shard by shard as the shards arrive.

    \b
    - progress bar: bytes, rate and ETA for the whole pull;
    - a transfer the network cuts resumes where it stopped (HTTP Range); a pull stopped by
      Ctrl-C or an error keeps the shards it quantized, and the next pull fetches the rest;
    - checks free disk for the plan first, and says how much it needs;
    - verifies every file against the hub's sha256 (git blob id for small files);
    - a repository that already holds our INT4 artifact (kimi-int4.json) is verified, not
      quantized again; a second pull of the same revision does nothing.

    huggingface_hub's settings apply: HF_TOKEN or `hf auth login`, HF_ENDPOINT (a mirror),
    HF_HUB_OFFLINE (then pull only reports what the cache holds). The cache is
    $CACHE_DIRECTORY, else $XDG_CACHE_HOME/kimi, else ~/.cache/kimi; serve the result with
    `kimi-engine serve --model ORG/REPO`.
    """
    from engined.weights.hub.pull import pull as run_pull

    hub_id = _hub_id(model)
    log = (lambda line: None) if quiet else (lambda line: click.echo(f"kimi-engine: {line}", err=True))
    try:
        entry = run_pull(hub_id, keep_source, plan, group_size, progress=not quiet, log=log)
    except (CheckpointError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{entry.id} {entry.path}")


@click.group(invoke_without_command=True)
@click.pass_context
def models(ctx):
    """List the models in the engine's cache: id, revisions, plan, size and origin."""
    if ctx.invoked_subcommand is not None:
        return
    from engined.weights.hub import store

    held = store.entries()
    if not held:
        click.echo(f"no models in {store.root()} (kimi-engine pull ORG/REPO adds one)")
        return
    for e in held:
        o = e.origin
        source = f"quantized from {o.get('endpoint')}/{e.repo}" if o.get("kind") == "quantized" \
            else f"published INT4 from {o.get('endpoint')}/{e.repo}"
        kept = f", BF16 kept in {o['source']}" if o.get("source") else ""
        click.echo(f"{e.id}  {','.join(e.revisions) or '-'}  plan {o.get('plan')}  "
                   f"{format_size(e.size)}  {source}{kept}  pulled {o.get('pulled_at')}  {e.path}")


@models.command("rm")
@click.argument("model_id", metavar="ID")
def models_rm(model_id):
    """Remove ID from the cache: ORG/REPO (every revision), ORG/REPO@REVISION, or an id as
    `kimi-engine models` prints it."""
    from engined.weights.hub import store

    removed = store.remove(model_id)
    if not removed:
        raise click.ClickException(f"{model_id}: not in the cache {store.root()}")
    for e in removed:
        click.echo(f"removed {e.id}")


COMMANDS = (pull, models)
