"""The training-job dashboard: one FineTuneJob's progress, memory, communication, GPUs and pods.

Label contract (what the queries assume about the scraped series):
- every trainer series carries the target labels `namespace`, `job` and `instance` (each rank
  is its own target, `instance` = pod IP and port) and `finetune_job`, the FineTuneJob name,
  which the chart's PodMonitor relabels from the pod label `finetune.dev/job-name`;
- only `finetune_trainer_info` and the `finetune_gpu_*`/memory series carry `rank`; other
  series get it by joining with `finetune_trainer_info` on the target (`job`, `instance`);
- dcgm-exporter series carry `UUID`, the same spelling `finetune_trainer_info` uses.

Aggregations keep `finetune_job`, so a panel still reads right when "All" namespaces match
several jobs of the same name.
"""

from __future__ import annotations

from .model import Dashboard, Panel, Row, Target, Variable

JOB = 'namespace=~"$namespace", finetune_job=~"$job"'
RANKED = JOB + ', rank=~"$rank"'
INFO = f"finetune_trainer_info{{{RANKED}}}"
RATE = "[$__rate_interval]"
BY_JOB = "by (finetune_job)"
H100_BF16_DENSE_TFLOPS = "989"
# The planner's model-state components (its activations, logits, buffers and overhead are not model state).
MODEL_STATE = "weights|trainable_weights|gradients|optimizer_states"


def with_rank(expr: str) -> str:
    """Attach `rank` to per-target series that lack it (and keep only the selected ranks)."""
    return f"({expr}) * on (job, instance) group_left (rank) {INFO}"


def on_gpu(dcgm_expr: str) -> str:
    """A dcgm-exporter series of the GPUs this job's selected ranks use, labelled with the rank."""
    ranks_by_uuid = f'max by (UUID, rank) (finetune_trainer_info{{{RANKED}, UUID!=""}})'
    return f"{dcgm_expr} * on (UUID) group_left (rank) {ranks_by_uuid}"


def _rate(metric: str) -> str:
    return f"rate({metric}{{{JOB}}}{RATE})"


def _mean_step_seconds() -> str:
    return (
        f"sum {BY_JOB} ({_rate('finetune_train_step_duration_seconds_sum')})"
        f" / sum {BY_JOB} ({_rate('finetune_train_step_duration_seconds_count')})"
    )


OVERVIEW = Row(
    "Overview",
    (
        Panel(
            "Step",
            (Target(f"max {BY_JOB} (finetune_train_global_step{{{JOB}}})", "{{finetune_job}}"),),
            kind="stat",
            width=4,
            height=4,
        ),
        Panel(
            "Progress",
            (
                Target(
                    f"max {BY_JOB} (finetune_train_global_step{{{JOB}}})"
                    f" / max {BY_JOB} (finetune_train_max_steps{{{JOB}}})",
                    "{{finetune_job}}",
                ),
            ),
            kind="stat",
            unit="percentunit",
            width=4,
            height=4,
        ),
        Panel(
            "ETA",
            (
                Target(
                    f"(max {BY_JOB} (finetune_train_max_steps{{{JOB}}})"
                    f" - max {BY_JOB} (finetune_train_global_step{{{JOB}}})) * ({_mean_step_seconds()})",
                    "{{finetune_job}}",
                ),
            ),
            kind="stat",
            unit="s",
            width=4,
            height=4,
            description="Steps left times the mean step time over the rate interval.",
        ),
        Panel(
            "Tokens/s",
            (Target(f"sum {BY_JOB} ({_rate('finetune_train_tokens_total')})", "{{finetune_job}}"),),
            kind="stat",
            width=4,
            height=4,
            description="Non-padding tokens per second, all ranks.",
        ),
        Panel(
            "MFU",
            (
                Target(
                    f"sum {BY_JOB} ({_rate('finetune_train_model_flops_total')})"
                    f" / (count {BY_JOB} (finetune_trainer_info{{{JOB}}}) * $peak_tflops * 1e12)",
                    "{{finetune_job}}",
                ),
            ),
            kind="stat",
            unit="percentunit",
            width=4,
            height=4,
            description="Model FLOPs (6 x tokens x parameters) per second over ranks x peak TFLOP/s "
            "(the peak_tflops variable; default: H100 SXM bf16 dense). Meaningless on CPU.",
        ),
        Panel(
            "Since last step",
            (
                Target(
                    f"time() - max {BY_JOB} (finetune_train_last_step_timestamp_seconds{{{JOB}}})", "{{finetune_job}}"
                ),
            ),
            kind="stat",
            unit="s",
            width=4,
            height=4,
            thresholds=((300, "orange"), (900, "red")),
            description="A growing value with a running job means a hang (often a stuck collective).",
        ),
    ),
)

PROGRESS = Row(
    "Progress",
    (
        Panel("Loss", (Target(f"avg {BY_JOB} (finetune_train_loss{{{JOB}}})", "{{finetune_job}}"),), width=8),
        Panel(
            "Learning rate",
            (Target(f"avg {BY_JOB} (finetune_train_learning_rate{{{JOB}}})", "{{finetune_job}}"),),
            width=8,
        ),
        Panel(
            "Gradient norm",
            (Target(f"avg {BY_JOB} (finetune_train_grad_norm{{{JOB}}})", "{{finetune_job}}"),),
            width=8,
            description="Before clipping.",
        ),
        Panel(
            "Step time",
            tuple(
                Target(
                    f"histogram_quantile({q}, sum by (finetune_job, le) "
                    f"({_rate('finetune_train_step_duration_seconds_bucket')}))",
                    f"p{round(q * 100)} {{{{finetune_job}}}}",
                )
                for q in (0.95, 0.5)
            ),
            unit="s",
        ),
        Panel(
            "Share of step time waiting for data",
            (
                Target(
                    f"sum {BY_JOB} ({_rate('finetune_train_dataloader_wait_seconds_sum')})"
                    f" / sum {BY_JOB} ({_rate('finetune_train_step_duration_seconds_sum')})",
                    "{{finetune_job}}",
                ),
            ),
            unit="percentunit",
            min_value=0,
            description="High means the data pipeline, not the GPU, sets the pace.",
        ),
        Panel(
            "Preference (DPO / ORPO)",
            tuple(
                Target(f"avg {BY_JOB} ({metric}{{{JOB}}})", f"{legend} {{{{finetune_job}}}}")
                for metric, legend in (
                    ("finetune_train_reward_chosen", "reward chosen"),
                    ("finetune_train_reward_rejected", "reward rejected"),
                    ("finetune_train_reward_margin", "margin"),
                    ("finetune_train_preference_accuracy", "accuracy"),
                    ("finetune_eval_preference_accuracy", "eval accuracy"),
                )
            ),
            width=24,
            description="TRL's definitions: a reward is beta x (policy - reference) log-probability of the "
            "completion for DPO, beta x the policy's mean log-probability per token for ORPO; the margin is "
            "chosen minus rejected, the accuracy the share of pairs whose chosen reward is the larger (0 to 1). "
            "Empty for SFT jobs (the trainer exports NaN).",
        ),
    ),
)

GPU_MEMORY = Row(
    "GPU memory",
    (
        Panel(
            "Allocator memory by rank",
            tuple(
                Target(
                    f"finetune_gpu_memory_{kind}_bytes{{{RANKED}}}", f"{kind.replace('_', ' ')} r{{{{rank}}}}", "gpu"
                )
                for kind in ("allocated", "reserved", "allocated_peak", "reserved_peak")
            ),
            unit="bytes",
            description="PyTorch caching allocator; peaks reset every step.",
        ),
        Panel(
            "Model state per GPU by component vs plan",
            (
                Target(
                    f"max by (component, device) (sum by (rank, component, device) "
                    f"(finetune_model_state_bytes{{{RANKED}}}))",
                    "{{component}} ({{device}})",
                ),
                Target(
                    f'max by (component) (finetune_planned_memory_bytes{{{RANKED}, component=~"{MODEL_STATE}"}})',
                    "planned {{component}}",
                ),
            ),
            unit="bytes",
            stacked=True,
            reference_series="^planned .*",
            description="Stacked: bytes of the real tensors (ZeRO-3: the local partitions) on the "
            "fullest selected rank. Dashed: what the planner predicted for the same components "
            "(its trainable_weights are the stack's trainable weights).",
        ),
        Panel(
            "Headroom by rank",
            (
                Target(
                    f"finetune_gpu_memory_total_bytes{{{RANKED}}}"
                    f" - finetune_gpu_memory_reserved_peak_bytes{{{RANKED}}}",
                    "r{{rank}}",
                    "gpu",
                ),
            ),
            unit="bytes",
            width=8,
            description="Device memory minus the step's reserved peak.",
        ),
        Panel(
            "Activation peak by rank",
            (Target(f"finetune_activation_peak_bytes{{{RANKED}}}", "r{{rank}}", "gpu"),),
            unit="bytes",
            width=8,
            description="Step peak minus what was allocated before the forward pass.",
        ),
        Panel(
            "Allocator retries and OOMs",
            (
                Target(
                    f"sum by (rank) (increase(finetune_gpu_memory_alloc_retries_total{{{RANKED}}}{RATE}))",
                    "retries r{{rank}}",
                    "gpu",
                ),
                Target(
                    f"sum by (rank) (increase(finetune_gpu_memory_ooms_total{{{RANKED}}}{RATE}))",
                    "OOMs r{{rank}}",
                    "gpu",
                ),
            ),
            width=8,
            min_value=0,
            description="Retries mean the allocator had to free its cache: fragmentation, close to OOM.",
        ),
    ),
)

COMMUNICATION = Row(
    "Communication",
    (
        Panel(
            "Share of step time in collectives by op",
            (
                Target(
                    f"sum by (op) ({_rate('finetune_comm_duration_seconds_sum')})"
                    f" / ignoring (op) group_left sum({_rate('finetune_train_step_duration_seconds_sum')})",
                    "{{op}}",
                ),
            ),
            unit="percentunit",
            stacked=True,
            width=8,
        ),
        Panel(
            "Bus bandwidth by op",
            (
                Target(
                    f"sum by (op) ({_rate('finetune_comm_bus_bytes_total')})"
                    f" / sum by (op) ({_rate('finetune_comm_duration_seconds_sum')})",
                    "{{op}}",
                ),
            ),
            unit="Bps",
            width=8,
            description="Bus bytes (nccl-tests' definition) per second spent in the collective.",
        ),
        Panel(
            "Bytes per step per rank by op",
            (
                Target(
                    f"sum by (op) ({_rate('finetune_comm_algorithm_bytes_total')})"
                    f" / ignoring (op) group_left sum({_rate('finetune_train_steps_total')})",
                    "{{op}}",
                ),
            ),
            unit="bytes",
            width=8,
            description="Algorithm bytes; compare with the planner's communication model.",
        ),
        Panel(
            "Collective latency p99 by op",
            (
                Target(
                    f"histogram_quantile(0.99, sum by (op, le) ({_rate('finetune_comm_duration_seconds_bucket')}))",
                    "{{op}}",
                ),
            ),
            unit="s",
        ),
        Panel(
            "Slowest ranks: time outside collectives per step",
            (
                Target(
                    "topk(5, "
                    + with_rank(
                        f"(sum by (job, instance) ({_rate('finetune_train_step_duration_seconds_sum')})"
                        f" - sum by (job, instance) ({_rate('finetune_comm_duration_seconds_sum')}))"
                        f" / sum by (job, instance) ({_rate('finetune_train_step_duration_seconds_count')})"
                    )
                    + ")",
                    "r{{rank}}",
                ),
            ),
            unit="s",
            description="Ranks wait for the slowest one inside collectives, so the rank that spends the "
            "most time outside them per step is the one holding the others back.",
        ),
    ),
)

GPU = Row(
    "GPU (dcgm-exporter)",
    (
        Panel(
            "Framebuffer used vs PyTorch reserved",
            (
                Target(on_gpu("DCGM_FI_DEV_FB_USED * 1048576"), "framebuffer r{{rank}}", "dcgm"),
                Target(f"finetune_gpu_memory_reserved_bytes{{{RANKED}}}", "reserved r{{rank}}", "gpu"),
            ),
            unit="bytes",
            description="DCGM_FI_DEV_FB_USED is in MiB. The gap to PyTorch's reserved memory is the CUDA "
            "context, NCCL buffers and anything else on the GPU.",
        ),
        Panel(
            "Tensor core activity",
            (Target(on_gpu("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), "r{{rank}}", "dcgm"),),
            unit="percentunit",
            min_value=0,
        ),
        Panel(
            "GPU utilisation",
            (Target(on_gpu("DCGM_FI_DEV_GPU_UTIL"), "r{{rank}}", "dcgm"),),
            unit="percent",
            min_value=0,
            description="Busy time, not efficiency: read it with tensor activity.",
        ),
        Panel(
            "PCIe receive",
            (Target(on_gpu("DCGM_FI_PROF_PCIE_RX_BYTES"), "r{{rank}}", "dcgm"),),
            unit="Bps",
            description="Host-to-device traffic: CPU offload of optimizer states or parameters shows here.",
        ),
    ),
)

PODS = Row(
    "Pods",
    (
        Panel(
            "Ranks scraped",
            (Target(f"sum {BY_JOB} (up{{{JOB}}})", "{{finetune_job}}"),),
            width=6,
            min_value=0,
            description="Ranks whose metrics endpoint answered the last scrape.",
        ),
        Panel(
            "Rank process restarts in range",
            (Target(with_rank(f"resets(finetune_train_steps_total{{{JOB}}}[$__range])"), "r{{rank}}"),),
            width=6,
            min_value=0,
            description="Counter resets of the step counter: each is a rank process that started again.",
        ),
        Panel(
            "Resident memory by rank",
            (Target(with_rank(f"process_resident_memory_bytes{{{JOB}}}"), "r{{rank}}"),),
            unit="bytes",
            width=6,
        ),
        Panel(
            "CPU by rank",
            (Target(with_rank(f"rate(process_cpu_seconds_total{{{JOB}}}{RATE})"), "r{{rank}}"),),
            width=6,
            min_value=0,
            description="CPU cores busy (data loading, offloaded optimizer steps).",
        ),
    ),
)

TRAINING_JOB = Dashboard(
    uid="finetune-training-job",
    title="Fine-tuning / Training job",
    description="One FineTuneJob: progress, GPU memory against the plan, communication, GPUs (dcgm) and pods.",
    tags=("finetune-operator", "training"),
    variables=(
        Variable("namespace", "Namespace", "label_values(finetune_trainer_info, namespace)", include_all=True),
        Variable("job", "FineTuneJob", 'label_values(finetune_trainer_info{namespace=~"$namespace"}, finetune_job)'),
        Variable(
            "rank",
            "Rank",
            f"label_values(finetune_trainer_info{{{JOB}}}, rank)",
            multi=True,
            include_all=True,
            numeric_sort=True,
        ),
        Variable("peak_tflops", "Peak TFLOP/s per GPU (MFU)", H100_BF16_DENSE_TFLOPS, kind="textbox"),
    ),
    rows=(OVERVIEW, PROGRESS, GPU_MEMORY, COMMUNICATION, GPU, PODS),
)
