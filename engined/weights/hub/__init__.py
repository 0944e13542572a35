"""Models by Hugging Face id: `ORG/REPO[@REVISION]` resolved through huggingface_hub (its cache,
token, endpoint and offline mode as the user has them), pulled shard by shard into the engine's
cache as our INT4 artifact, and listed or removed there."""
