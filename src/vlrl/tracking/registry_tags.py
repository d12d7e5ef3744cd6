"""How the adapter registry reads evaluations and writes them onto versions as tags.

A version's tags carry its identity (`version_tags`: adapter, base, run, code, config and reward
hashes, split versions) and its evaluations (`eval_tags`: per split the candidate's successes,
tasks hash and decoding, plus `eval.<split>.peers`, the other models evaluated on exactly the
same tasks, paired where both summaries record per-task outcomes). `evals_from_tags` reads the
records back for the promotion gate. The registry itself (`registry.py`) holds no tag format.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vlrl.errors import VlrlError
from vlrl.eval.stats import pair_outcomes
from vlrl.tracking.gate import EvalRecord, decoding_kind
from vlrl.tracking.lineage import now_iso, who

SPLITS = ("holdout", "adversarial")
BASE_PEER = "base"  # peers key of the bare base model


def read_eval_summaries(eval_dirs: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every summary.json under the given `vlrl eval -o` folders (or summary files)."""
    summaries = []
    for d in map(Path, eval_dirs):
        files = [d] if d.is_file() else sorted(d.rglob("summary.json")) if d.is_dir() else None
        if files is None:
            raise VlrlError(f"evaluation folder {d} does not exist")
        if not files:
            raise VlrlError(f"no summary.json under {d}; pass the folder `vlrl eval -o` wrote")
        for f in files:
            try:
                summary = json.loads(f.read_text())
            except json.JSONDecodeError as exc:
                raise VlrlError(f"{f} is not valid JSON ({exc.msg})") from None
            if not isinstance(summary.get("model"), dict):
                raise VlrlError(
                    f"{f} does not say which model it evaluated; re-run `vlrl eval` with this version of vlrl"
                )
            summaries.append({**summary, "_file": str(f)})
    return summaries


def discordant_from_files(
    candidate_tags: dict[str, str], baseline_tags: dict[str, str], split: str
) -> tuple[int, int] | None:
    """(only the candidate solved, only the baseline solved), paired through the two versions' own
    summary files (`eval.<split>.summary_file`) when both still exist and record per-task outcomes."""
    outcomes = []
    for tags in (candidate_tags, baseline_tags):
        path = Path(tags.get(f"eval.{split}.summary_file", ""))
        try:
            outcomes.append(json.loads(path.read_text())["outcomes"])
        except (OSError, ValueError, KeyError):
            return None
    pair = pair_outcomes(
        outcomes[0],
        outcomes[1],
        candidate_tags[f"eval.{split}.summary_file"],
        baseline_tags[f"eval.{split}.summary_file"],
    )
    return pair.only_a, pair.only_b


def peer_key(summary: dict[str, Any]) -> str:
    return summary["model"].get("adapter_fingerprint") or BASE_PEER


def evals_from_tags(tags: dict[str, str]) -> dict[str, EvalRecord]:
    """The evaluation records a version's tags carry, by split."""
    out = {}
    for split in SPLITS:
        if f"eval.{split}.successes" in tags:
            out[split] = EvalRecord.from_json(
                {
                    "split": split,
                    **{
                        k: tags[f"eval.{split}.{k}"]
                        for k in ("successes", "n", "decoding", "split_version", "tasks_hash")
                    },
                }
            )
    return out


def version_tags(info: dict[str, Any], lineage: dict[str, Any]) -> dict[str, str]:
    """A version's identity tags: adapter, base, run, code, config and reward hashes, splits."""
    git = lineage.get("code", {}).get("git", {})
    tags = {
        "adapter_path": info["path"],
        "adapter_fingerprint": info["fingerprint"],
        "base_fingerprint": info["base_fingerprint"],
        "base_model": lineage.get("model", {}).get("path"),
        "run_dir": lineage.get("run", {}).get("dir"),
        "run_id": lineage.get("tracking", {}).get("run_id"),
        "tracking_uri": lineage.get("tracking", {}).get("uri"),
        "git_commit": git.get("commit"),
        "git_dirty": str(git.get("dirty")) if "dirty" in git else None,
        "image": lineage.get("code", {}).get("image"),
        "config_hash": lineage.get("config_hash"),
        "reward_hash": lineage.get("rewards", {}).get("hash"),
        "registered_at": now_iso(),
        "registered_by": "{user}@{host}".format(**who()),
    }
    for split, s in lineage.get("data", {}).get("splits", {}).items():
        tags[f"split.{split}.version"] = s.get("version")
        tags[f"split.{split}.seeds"] = f"[{s.get('seed_start')},{s.get('seed_end')})"
    return {k: str(v) for k, v in tags.items() if v is not None}


def eval_tags(info: dict[str, Any], summaries: list[dict[str, Any]], want: str) -> dict[str, str]:
    """The candidate's `eval.<split>.*` tags from the summaries decoded the way `want` names, with the
    other models evaluated on the same tasks as its peers (paired where both record outcomes)."""
    tags: dict[str, str] = {}
    for split in SPLITS:
        mine = [
            s
            for s in summaries
            if s.get("split") == split
            and decoding_kind(s.get("decoding", "")) == want
            and s["model"].get("adapter_fingerprint") == info["fingerprint"]
        ]
        if not mine:
            continue
        own = max(mine, key=lambda s: (s.get("n", 0), s.get("evaluated_at", "")))  # the largest, then newest
        if own["model"].get("base_fingerprint") != info["base_fingerprint"]:
            raise VlrlError(f"{own['_file']} evaluated the adapter on another base model")
        record = EvalRecord.from_summary(own)
        peers = {}
        for s in summaries:
            if (
                s.get("split") != split
                or s["model"].get("base_fingerprint") != info["base_fingerprint"]
                or s["model"].get("adapter_fingerprint") == info["fingerprint"]
            ):
                continue
            other = EvalRecord.from_summary(s)
            if other.same_tasks(record):
                peers[peer_key(s)] = [other.successes, other.n]
                if "outcomes" in own and "outcomes" in s:  # paired: + [only the candidate solved, only this peer]
                    pair = pair_outcomes(own["outcomes"], s["outcomes"], own["_file"], s["_file"])
                    peers[peer_key(s)] += [pair.only_a, pair.only_b]
        for key, value in record.to_json().items():
            tags[f"eval.{split}.{key}"] = str(value)
        tags[f"eval.{split}.rate"] = f"{record.proportion.rate:.6f}"
        tags[f"eval.{split}.peers"] = json.dumps(peers, sort_keys=True)
        tags[f"eval.{split}.summary_file"] = own["_file"]
    return tags
