"""One rank of the TRL DPOTrainer baseline, started by the DeepSpeed launcher (see dpo_vs_trl.py).

Same model, preference pairs (TRL's conversational form), LoRA settings, beta and DeepSpeed
config as the `ftjob run` side; the reference is the base with the adapter off, as TRL does for
a peft model. Prints one JSON line with its useful (non-padding) tokens, training seconds and
peak resident memory. Needs `trl` (dev group); never imported by the package or the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="JSONL of prompt/chosen/rejected records")
    parser.add_argument("--deepspeed", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--micro", type=int, required=True, help="pairs per micro-batch")
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()

    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.dpo_config import DPOConfig
    from trl.trainer.dpo_trainer import DPOTrainer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    dataset = load_dataset("json", data_files=args.data, split="train")
    config = DPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=args.micro,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, args.steps // 20),
        logging_steps=args.steps,
        save_strategy="no",
        report_to=[],
        deepspeed=json.loads(Path(args.deepspeed).read_text()),
        max_length=args.max_length,
        beta=args.beta,
        use_cpu=True,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        seed=42,
        disable_tqdm=True,
    )
    counted = {"tokens": 0}
    trainer: Any = DPOTrainer(  # Any: its compute_loss is wrapped below
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, target_modules="all-linear"
        ),
    )
    original = trainer.compute_loss

    def compute_loss(model: Any, inputs: dict[str, Any], *a: Any, **k: Any) -> Any:
        counted["tokens"] += int(inputs["attention_mask"].sum())  # chosen and rejected rows, prompts included
        return original(model, inputs, *a, **k)

    trainer.compute_loss = compute_loss
    began = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - began
    print(
        "TRL_RESULT "
        + json.dumps(
            {
                "rank": int(os.environ.get("RANK", "0")),
                "tokens": counted["tokens"],
                "seconds": seconds,
                "train_runtime": result.metrics.get("train_runtime"),
                "loss": result.metrics.get("train_loss"),
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
