"""What a run tag is made of: the keys it never names and how it spells a value. lra.naming names run folders by
them and the collector (lra.tools.collect) labels rows by them; it imports nothing, so the collector stays free of
torch and Hydra."""

import json

# Resolved keys that never enter the tag: folder levels, tables whose effect shows in the keys they feed
# (attn_options -> attn.options), and settings that change how a run
# is executed or logged but not what it computes (the resume key and record still hold them), and labels
# (name: the record's display name).
UNTAGGED = (
    "preset",
    "semantics",
    "seed",
    "name",
    "task.name",
    "attn.name",
    "attn.label",
    "attn.target",
    "attn.base_options",
    "attn_options",
    "quirks",
    "runs_root",
    "data_root",
    "run_tag",
    "force",
    "num_threads",
    "fit",
    "hardware",
    "logger",
    "trainer.progress",
    "trainer.num_workers",
    "trainer.log_every_n_steps",
    "train.compile",
    "train.ckpt_every_steps",
)


def flat(node, prefix: str = "") -> dict:
    """A nested config as {dotted key: value}; an empty table is a value of its own."""
    if isinstance(node, dict) and node:
        return {k: v for key, sub in node.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: node}


def spelled(value) -> str:
    """A config value as a run tag spells it: text as it is, else compact JSON with sorted keys."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
