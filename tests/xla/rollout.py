"""GRPO rollouts on 8 XLA:CPU devices under SPMD (tests/test_rollout_sampling.py): `sample_rollout`
on a replicated tiny Llama, then on the same weights sharded over a data=2 x fsdp=4 mesh with its
rows split by `row_sharding`. For each: compiles of two same-shape sampled calls, host transfers
while sampling and reading, a prewarmed bucket, the sampler's log-probs against a CPU training forward of its
sequences, where the KV cache and the outputs were placed; and on the mesh the greedy tokens
(against CPU ``model.generate``).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from tests.xla import run
from tests.xla.generation import prompts, reference, tiny_model

NEW_TOKENS = 12
FIRST = (3, 7, 13, 9, 5, 16, 11, 2)  # eight rows in the bucket of 16
SECOND = (4, 6, 15, 10, 8, 12, 1, 14)
PAD = 0
OPTIONS = {"max_new_tokens": NEW_TOKENS, "temperature": 0.7, "top_p": 0.9, "pad_token_id": PAD}


def left_padded(lengths: tuple[int, ...], offset: int, bucket: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(lengths), bucket), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts(lengths, offset)):
        ids[r, bucket - len(p) :] = torch.tensor(p)
        mask[r, bucket - len(p) :] = 1
    return ids, mask


def logps_error(cpu_model: Any, host: dict[str, torch.Tensor]) -> float:
    """Largest gap between the sampler's log-probs and a CPU training forward of its rows (T = 0.7)."""
    with torch.no_grad():
        logits = cpu_model(
            input_ids=host["sequences"],
            attention_mask=host["attention_mask"],
            position_ids=host["position_ids"],
        ).logits.float()
    completion = host["completion_ids"]
    scaled = logits[:, -completion.shape[1] - 1 : -1] / OPTIONS["temperature"]
    expected = torch.log_softmax(scaled, dim=-1).gather(-1, completion[..., None])[..., 0]
    return float(((expected - host["logps"]) * host["completion_mask"]).abs().max())


def rollouts(model: Any, cpu_model: Any, eos: int, row_sharding: Any) -> dict[str, Any]:
    from workbench import decoding
    from workbench.backend.xla import runtime
    from workbench.generate import prewarm_rollout, read_rollout, sample_rollout

    caches: list[Any] = []
    build_cache = decoding.static_cache
    decoding.static_cache = lambda *args: (
        caches.append(build_cache(*args)) or caches[-1]
    )  # to see its sharding
    first, second = left_padded(FIRST, 5), left_padded(SECOND, 11)
    kwargs = dict(OPTIONS, eos_token_id=eos, row_sharding=row_sharding)
    compiles, seconds = [], []
    for seed, (ids, mask) in enumerate([first, second]):
        before, start = runtime.compile_count(), time.perf_counter()
        transfers = runtime.transfer_count()
        rollout = sample_rollout(model, ids, mask, seed=seed, **kwargs)
        runtime.wait_device_ops()
        seconds.append(round(time.perf_counter() - start, 2))
        compiles.append(runtime.compile_count() - before)
    sampling = runtime.transfer_count() - transfers
    transfers = runtime.transfer_count()
    tokens, finished = read_rollout(rollout)
    read = runtime.transfer_count() - transfers
    fields = ["sequences", "attention_mask", "position_ids", "completion_ids", "completion_mask", "logps"]
    host = dict(zip(fields, runtime.to_cpu([getattr(rollout, f) for f in fields])))
    decoding.static_cache = build_cache
    out = {
        "compiles": compiles,
        "seconds": seconds,
        "transfers_sampling": sampling,
        "transfers_read": read,
        "sampled": tokens,
        "finished": finished,
        "logps_max_error": logps_error(cpu_model, host),
        "output_sharding": runtime.sharding_spec(rollout.sequences),
        "cache_sharding": runtime.sharding_spec(caches[-1].layers[0].keys),
    }
    if row_sharding is None:  # a prewarm of another bucket, then a rollout in it: nothing left to compile
        short = left_padded((3, 7, 5, 2, 4, 6, 1, 8), 17, bucket=8)
        prewarm_kwargs = {k: v for k, v in kwargs.items() if k != "pad_token_id"}
        warmed = prewarm_rollout(model, buckets=[8], rows=8, pad_token_id=PAD, **prewarm_kwargs)
        before = runtime.compile_count()
        sample_rollout(model, *short, seed=5, **kwargs)
        runtime.wait_device_ops()
        out["prewarm"] = [warmed, runtime.compile_count() - before]
    if row_sharding is not None:  # greedy too, against CPU model.generate (three more programs)
        out["greedy"] = read_rollout(sample_rollout(model, *first, **dict(kwargs, temperature=0.0)))[0]
        out["input_sharding"] = runtime.sharding_spec(row_sharding(first[0]))
    return out


def main() -> dict[str, Any]:
    from workbench.backend.xla import runtime
    from workbench.parallel.apply import move_model, shard_batch, shard_model
    from workbench.parallel.mesh import MeshSpec

    runtime.use_spmd()
    cpu_model = tiny_model("llama")
    free = reference(cpu_model, prompts(FIRST, 5), new=NEW_TOKENS)
    eos = free[1][4]  # the second row's greedy continuation ends at its fifth token
    expected = [row[: row.index(eos) + 1] if eos in row else row for row in free]

    plain = rollouts(move_model(copy.deepcopy(cpu_model)), cpu_model, eos, None)
    mesh = MeshSpec(data=2, fsdp=4).build()
    sharded_model = copy.deepcopy(cpu_model)
    shard_model(sharded_model, mesh)
    sharded = rollouts(sharded_model, cpu_model, eos, lambda t: shard_batch({"rows": t}, mesh)["rows"])
    sharded["greedy_matches_cpu"] = sharded["greedy"] == expected
    sharded["sampled_equals_plain"] = sharded["sampled"] == plain["sampled"]
    return {"plain": plain, "sharded": sharded, "eos": eos}


if __name__ == "__main__":
    run(main)
