"""Benchmark (b): predicted model-state bytes vs what real DeepSpeed engines hold.

Small Llama-shaped models (configs generated here, random init) run one real training
step on 2 CPU ranks (gloo) under each ZeRO stage and offload, with LoRA and full
fine-tuning. Each rank sums the bytes of the tensors the engine really keeps: 16-bit
parameters (ZeRO-3: their `ds_tensor` partitions), gradient partitions, fp32 master
weights and Adam states. The planner's prediction for the same job is printed beside
it. Run on demand; nothing here is asserted by the tests.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/planner_real_engines.py [--full-matrix]
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/planner_real_engines.py --smoke   # LoRA, ZeRO-2 and ZeRO-3 offload

A rank that fails ends the benchmark at once with exit status 1 (the other rank is stopped).
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import time
from pathlib import Path
from typing import Any

from finetune_localcluster.ports import free_port

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

SIZES: dict[str, dict[str, int]] = {
    "llama-10m": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 8, "num_attention_heads": 4},
    "llama-40m": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8},
    "llama-150m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 12},
}
STRATEGIES: list[tuple[int, str, str]] = [
    (0, "none", "none"),
    (1, "none", "none"),
    (2, "none", "none"),
    (3, "none", "none"),
    (2, "cpu", "none"),
    (3, "cpu", "none"),
    (3, "cpu", "cpu"),
]


def model_config(size: str) -> dict[str, Any]:
    dims = SIZES[size]
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 8192,
        "num_key_value_heads": dims["num_attention_heads"],
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        **dims,
    }


def job_spec(config_dir: str, method: str, strategy: tuple[int, str, str]) -> Any:
    from finetune_operator.api.spec import FineTuneJobSpec

    stage, offload_optimizer, offload_params = strategy
    return FineTuneJobSpec.from_wire(
        {
            "model": {"uri": config_dir},
            "dataset": {"uri": "builtin://reverse-words", "maxSeqLength": 64},
            "method": {"type": method},
            "training": {"microBatchSize": 1, "globalBatchSize": 2, "gradientCheckpointing": "false"},
            "resources": {"numNodes": 1, "gpusPerNode": 2, "gpuMemory": "80Gi"},
            "deepspeed": {"zeroStage": stage, "offloadOptimizer": offload_optimizer, "offloadParams": offload_params},
            "output": {"uri": "/tmp/out"},
        }
    )


def _storages_bytes(tensors: list[Any]) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is None or tensor.numel() == 0:
            continue
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def held_model_state_bytes(engine: Any, stage: int) -> dict[str, int]:
    """Bytes of what the engine really keeps, by kind (device and host together)."""
    optimizer = engine.optimizer
    params = list(engine.module.parameters())
    if stage == 3:
        sixteen = [p.ds_tensor for p in params if hasattr(p, "ds_tensor")]
        grads = [getattr(optimizer, "grad_partitions_flat_buffer", None)]
        master = list(getattr(optimizer, "fp32_partitioned_groups_flat", []))
    else:
        sixteen = [p.data for p in params]
        grads = [p.grad for p in params]
        for name in ("averaged_gradients", "fp32_groups_gradients_flat"):
            value = getattr(optimizer, name, None)
            if isinstance(value, dict):
                grads += [g for group in value.values() for g in (group if isinstance(group, list) else [group])]
            elif isinstance(value, list):
                grads += [g for g in value if hasattr(g, "untyped_storage")]
        master = list(getattr(optimizer, "single_partition_of_fp32_groups", []))
        master += list(getattr(optimizer, "fp32_groups_flat_partition", []))
        master += list(getattr(optimizer, "fp32_groups_flat", []))
        master += [p for group in getattr(optimizer, "fp32_groups", []) for p in group]
    grads += [m.grad for m in master if getattr(m, "grad", None) is not None]
    inner = getattr(optimizer, "optimizer", optimizer)
    states = [
        t for state in inner.state.values() for t in state.values() if hasattr(t, "untyped_storage") and t.dim() > 0
    ]
    return {
        "params16": _storages_bytes(sixteen),
        "grads": _storages_bytes(grads),
        "master": _storages_bytes(master),
        "adam": _storages_bytes(states),
    }


def _rank_main(rank: int, port: int, config_dir: str, method: str, strategy: tuple[int, str, str], out: Any) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    import logging

    import torch

    from finetune_operator.plan import fixed_plan
    from finetune_operator.plan.counting.meta_count import build_config
    from finetune_operator.render.deepspeed_config import deepspeed_config
    from finetune_trainer.deepspeed_import import import_deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    torch.manual_seed(0)
    spec = job_spec(config_dir, method, strategy)
    ds_config = deepspeed_config(spec, fixed_plan(spec))
    ds_config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}
    deepspeed = import_deepspeed()  # without its CPU shm op, as the trainer's ranks
    deepspeed.init_distributed(dist_backend="gloo")
    from transformers import AutoModelForCausalLM

    hf_config = build_config(model_config_from(config_dir))
    with deepspeed.zero.Init(enabled=strategy[0] == 3, config_dict_or_path=ds_config):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    from finetune_operator.api.methods import MethodType

    if method == MethodType.LORA:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trainable, config=ds_config)
    tokens = torch.randint(0, 8192, (1, 64))
    loss = engine(input_ids=tokens, labels=tokens).loss
    engine.backward(loss)
    engine.step()
    out.put((rank, held_model_state_bytes(engine, strategy[0])))


def predicted_bytes(config_dir: str, method: str, strategy: tuple[int, str, str]) -> int:
    from finetune_operator.api.strategy import Strategy
    from finetune_operator.plan.search.memory import resident_model_state_bytes
    from finetune_operator.plan.workload import workload_from_spec

    workload = workload_from_spec(job_spec(config_dir, method, strategy))
    stage, optimizer, params = strategy
    held = Strategy(
        zero_stage=stage,
        offload_optimizer=optimizer,
        offload_params=params,
        micro_batch_size=1,
        gradient_accumulation_steps=1,
    )
    return resident_model_state_bytes(workload, held)


def model_config_from(config_dir: str) -> dict[str, Any]:
    import json

    return dict(json.loads((Path(config_dir) / "config.json").read_text()))


class RankFailed(RuntimeError):
    """A rank exited without handing back its measurement."""


def collect(results: Any, procs: list[Any], timeout: float) -> list[tuple[int, dict[str, int]]]:
    """One result per rank; stop as soon as a rank failed, or all exited, without one (it would never come)."""
    got: list[tuple[int, dict[str, int]]] = []
    deadline = time.monotonic() + timeout
    while len(got) < len(procs):
        try:
            got.append(results.get(timeout=1))
            continue
        except queue.Empty:
            pass
        codes = [p.exitcode for p in procs]
        failed = any(code not in (None, 0) for code in codes) or None not in codes
        if failed or time.monotonic() > deadline:
            for proc in procs:
                proc.kill()
            raise RankFailed(f"rank exit codes {codes}" if failed else f"no result within {timeout:.0f} s")
    return got


def measure(size: str, method: str, strategy: tuple[int, str, str], workdir: Path) -> tuple[dict[str, int], int]:
    import json

    import torch.multiprocessing as mp

    config_dir = workdir / size
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config.json").write_text(json.dumps(model_config(size)))
    port = free_port()
    context = mp.get_context("spawn")
    handed_back = context.Queue()
    procs = [
        context.Process(target=_rank_main, args=(rank, port, str(config_dir), method, strategy, handed_back))
        for rank in range(2)
    ]
    for proc in procs:
        proc.start()
    results = collect(handed_back, procs, timeout=600)
    for proc in procs:
        proc.join()
    rank0 = next(r for r in results if r[0] == 0)
    return rank0[1], predicted_bytes(str(config_dir), method, strategy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full-matrix", action="store_true", help="every size × method × strategy (slow)")
    parser.add_argument("--sizes", nargs="*", default=None, choices=list(SIZES))
    parser.add_argument("--smoke", action="store_true", help="llama-10m LoRA under ZeRO-2 and ZeRO-3 + offload")
    args = parser.parse_args(argv)
    import tempfile

    sizes = args.sizes or (list(SIZES) if args.full_matrix else ["llama-10m"])
    methods = ["full", "lora"]
    strategies = STRATEGIES
    if args.smoke:  # the two ways of counting held bytes: flat ZeRO-1/2 buffers, ZeRO-3 partitions
        sizes, methods, strategies = ["llama-10m"], ["lora"], [(2, "none", "none"), (3, "cpu", "none")]
    print(
        f"{'model':11} {'method':6} {'strategy':24} {'held MiB':>9} {'predicted':>9} {'diff':>7}"
        "   held per rank: params16/grads/master/adam (MiB)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            for method in methods:
                for strategy in strategies:
                    try:
                        held, predicted = measure(size, method, strategy, Path(tmp))
                    except RankFailed as exc:
                        print(f"planner_real_engines: {size} {method} {strategy}: {exc}", file=sys.stderr)
                        return 1
                    held_total = sum(held.values())
                    predicted_total = predicted
                    label = f"z{strategy[0]} opt={strategy[1]} par={strategy[2]}"
                    diff = (predicted_total - held_total) / held_total * 100
                    parts = "/".join(f"{held[k] / 2**20:.1f}" for k in ("params16", "grads", "master", "adam"))
                    print(
                        f"{size:11} {method:6} {label:24} {held_total / 2**20:9.1f} "
                        f"{predicted_total / 2**20:9.1f} {diff:+6.1f}%   {parts}",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
